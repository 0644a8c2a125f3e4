// engine/internal/vulkan_compute.cc — the "vulkan" compute device
// (vulkan_compute.h; Note [The Vulkan forward pass] there).
#include "engine/internal/vulkan_compute.h"

#if ARBITER_HAS_VULKAN

#include <cmath>
#include <cstring>
#include <algorithm>
#include <cstdlib>
#include <map>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "arbiter/base/mutex.h"
#include "arbiter/vulkan/coopmat_gemm.h"
#include "arbiter/vulkan/vulkan_backend.h"
#include "arbiter/vulkan/vulkan_device.h"
#include "engine/internal/forward.h"

namespace arbiter::engine_internal {
namespace {

using vulkan::BufferMemory;
using vulkan::GemmPush;
using vulkan::VulkanBuffer;
using vulkan::VulkanDevice;

// The kernel-name suffix of a weight type the shaders read, or empty.
std::string_view TypeSuffix(GgmlType t) {
  switch (t) {
    case GgmlType::kF32: return "f32";
    case GgmlType::kF16: return "f16";
    case GgmlType::kBF16: return "bf16";
    case GgmlType::kQ8_0: return "q8_0";
    case GgmlType::kQ4_0: return "q4_0";
    case GgmlType::kQ4_1: return "q4_1";
    case GgmlType::kQ5_0: return "q5_0";
    case GgmlType::kQ5_1: return "q5_1";
    case GgmlType::kQ4_K: return "q4_k";
    case GgmlType::kQ5_K: return "q5_k";
    case GgmlType::kQ6_K: return "q6_k";
    default: return "";
  }
}

// Query-row splits of a decode step's attention (attention.comp): enough
// workgroups per step for a few heads to fill a large device, and no more
// splits than the context has 64-position parts.
uint32_t DecodeSplits(const ModelDims& d, int n_ctx) {
  const int want = (512 + d.n_heads - 1) / d.n_heads;
  return static_cast<uint32_t>(std::max(1, std::min(want, n_ctx / 64)));
}

// Activation scratch of one slot, in floats, and where each part starts:
// rows for a prefill chunk of `batch` tokens (decode uses row 0) and the
// decode attention's split partials and per-head counts.
struct ScratchLayout {
  size_t x = 0, xn = 0, qkv = 0, att = 0, gu = 0, act = 0, part = 0, count = 0, total = 0;
};
ScratchLayout ScratchFor(const ModelDims& d, int batch, int n_ctx) {
  ScratchLayout s;
  size_t at = 0;
  const auto b = static_cast<size_t>(batch);
  // Each part starts on a 64-float (256-byte) boundary.
  auto take = [&](size_t n) {
    const size_t here = at;
    at += (n + 63) / 64 * 64;
    return here;
  };
  s.x = take(b * d.hidden);
  s.xn = take(b * d.hidden);
  s.qkv = take(b * d.qkv_dim);
  s.att = take(b * d.q_dim);
  s.gu = take(b * 2 * d.inter);
  s.act = take(b * d.inter);
  s.part = take(size_t{1} * d.n_heads * DecodeSplits(d, n_ctx) * (d.head_dim + 2));
  s.count = take(static_cast<size_t>(d.n_heads));  // uints, zero between passes
  s.total = at;
  return s;
}

// The host-visible part of a slot, in bytes: the step (pos at 0, then the
// token ids [batch] at 16), logits [vocab] (one row: decode, a prefill's
// last token), the final-normed hidden rows [batch, hidden].
struct OutLayout {
  size_t tokens = 16, logits = 0, hidden = 0, total = 0;
};
OutLayout OutFor(const ModelDims& d, int batch) {
  auto up = [](size_t n) { return (n + 255) / 256 * 256; };
  OutLayout o;
  o.logits = up(o.tokens + size_t{4} * batch);
  o.hidden = up(o.logits + size_t{4} * d.vocab);
  o.total = up(o.hidden + size_t{4} * batch * d.hidden);
  return o;
}

size_t KvRowBytesF16(const ModelDims& d) { return size_t{1} * d.kv_dim * 2; }

class VulkanSlot final : public ComputeSlot {
 public:
  VulkanSlot(std::shared_ptr<VulkanDevice> dev, SlotFootprint f) : dev(std::move(dev)), fp(f) {}
  ~VulkanSlot() override {
    for (VkCommandBuffer& cb : cbs) {
      if (cb != VK_NULL_HANDLE) vkFreeCommandBuffers(dev->device(), pool, 1, &cb);
    }
    dev->DestroyCommandPool(pool);
    if (queries != VK_NULL_HANDLE) vkDestroyQueryPool(dev->device(), queries, nullptr);
    dev->Destroy(kv);
    dev->Destroy(scratch);
    dev->Destroy(out);
  }
  SlotFootprint footprint() const override { return fp; }

  std::shared_ptr<VulkanDevice> dev;
  SlotFootprint fp;
  VulkanBuffer kv;       // device: [n_layers][2][n_ctx] rows of kv_dim f16
  VulkanBuffer scratch;  // device: ScratchLayout floats
  VulkanBuffer out;      // host-visible: OutLayout
  VkCommandPool pool = VK_NULL_HANDLE;
  // [0]: one decode step, recorded for the weights placement
  // `decode_for`; [1]: a prefill chunk, recorded per chunk.
  VkCommandBuffer cbs[2] = {VK_NULL_HANDLE, VK_NULL_HANDLE};
  uint64_t decode_for = 0;
  // Profiling (Note [Vulkan profiling]): timestamps of cbs[k] at
  // [k · query_half, k · query_half + names[k].size() + 1), and the kernel
  // name of each dispatch.
  VkQueryPool queries = VK_NULL_HANDLE;
  uint32_t query_half = 0;
  std::vector<std::string> names[2];
};

class VulkanWeights final : public ComputeWeights {
 public:
  std::vector<uint64_t> addr;  // device address of each layout buffer
  uint64_t id = 0;             // hash of the addresses: the placement
};

// A pipeline and its shader's name (the profile's key).
struct Kernel {
  std::string name;
  VkPipeline pipeline = VK_NULL_HANDLE;
};

struct Dispatch {
  Kernel kernel;
  std::vector<uint8_t> push;
  uint32_t gx, gy, gz = 1;
  // A barrier after it (none between the independent segments of one
  // projection).
  bool barrier = true;
};

template <typename T>
std::vector<uint8_t> Bytes(const T& v) {
  static_assert(sizeof(T) <= vulkan::kPushConstantBytes);
  std::vector<uint8_t> b(sizeof(T));
  std::memcpy(b.data(), &v, sizeof(T));
  return b;
}

// Push-constant blocks, as the shaders declare them (std430-like: 8-byte
// addresses first, then 4-byte fields).
struct MatvecPush {
  uint64_t w, x, y, bias, norm;
  uint32_t rows, cols, row_bytes, accumulate, vec4, mode;
  float eps;
};
// What a decode matvec folds into its x loads (matvec.comp's mode).
struct MatvecFusion {
  uint32_t mode = 0;  // 0: none; 1: RMSNorm of x with `norm`; 2: silu(gate) · up
  uint64_t norm = 0;
  float eps = 0;
};
constexpr uint32_t kMatvecRows = 4;  // rows per matvec workgroup (matvec.comp's NR)
struct EmbedPush {
  uint64_t w, out, tokens;
  uint32_t rows, cols, row_bytes;
};
struct NormPush {
  uint64_t x, weight, out;
  uint32_t n;
  float eps;
};
struct RopePush {
  uint64_t qkv, q_norm, k_norm, rope, kcache, vcache, step;
  uint32_t n_heads, n_kv_heads, head_dim, n_ctx;
  float eps;
};
struct AttnPush {
  uint64_t q, kcache, vcache, part, count, out, step;
  uint32_t n_heads, n_kv_heads, head_dim, n_split;
  float scale;
};
struct SiluPush {
  uint64_t gu, out;
  uint32_t n;
};

class VulkanDecoderCompute final : public HiddenInputCompute {
 public:
  VulkanDecoderCompute(const ComputeSpec& spec, std::shared_ptr<VulkanDevice> dev)
      : spec_(spec), layout_(spec.layout), dims_(spec.layout->dims), dev_(std::move(dev)),
        domain_(dev_->domain()), footprint_(VulkanSlotFootprint(spec)),
        scratch_(ScratchFor(dims_, spec.batch, spec.n_ctx)), outl_(OutFor(dims_, spec.batch)),
        decode_splits_(DecodeSplits(dims_, spec.n_ctx)),
        first_(std::clamp(spec.first_layer, 0, dims_.n_layers)),
        n_kv_layers_(dims_.n_layers - first_) {
    if (first_ > 0) lease_buffers_ = SplitBuffersOf(*layout_, first_).device;
  }
  ~VulkanDecoderCompute() override {
    if (profile_) LogProfile();
    dev_->Destroy(rope_);
  }

  Status Init() {
    if (const char* v = std::getenv("ARBITER_VULKAN_PROFILE");
        v != nullptr && *v != '\0' && std::string_view(v) != "0") {
      if (dev_->timestamp_valid_bits() == 0 || dev_->timestamp_period_ns() <= 0) {
        spdlog::warn("ARBITER_VULKAN_PROFILE: device {} has no timestamps on its compute queue; "
                     "not profiling",
                     domain_);
      } else {
        profile_ = true;
        const long every = std::strtol(v, nullptr, 10);
        profile_every_ = every > 1 ? static_cast<uint64_t>(every) : 0;
      }
    }
    // RoPE tables in double, as the CPU's (forward.h), uploaded once.
    const int half = dims_.head_dim / 2;
    const std::vector<double> inv = RopeInverseFrequencies(layout_->config, dims_.head_dim);
    std::vector<float> t(size_t{2} * spec_.n_ctx * half);
    for (int p = 0; p < spec_.n_ctx; ++p) {
      for (int i = 0; i < half; ++i) {
        const double a = p * inv[static_cast<size_t>(i)];
        t[size_t{1} * p * half + i] = static_cast<float>(std::cos(a));
        t[size_t{1} * spec_.n_ctx * half + size_t{1} * p * half + i] =
            static_cast<float>(std::sin(a));
      }
    }
    ARBITER_ASSIGN_OR_RETURN(rope_, dev_->CreateBuffer(t.size() * 4, BufferMemory::kDevice));
    ARBITER_RETURN_IF_ERROR(dev_->Upload(rope_, 0, t.data(), t.size() * 4));
    // The prefill GEMM: cooperative-matrix where the device has it and it
    // passes its self-check (Note [Cooperative-matrix GEMM]).
    gemm_ = vulkan::SelectGemm(*dev_);
    for (std::string_view k : {"rmsnorm", "rope_kv", "attention", "silu_mul"}) {
      ARBITER_RETURN_IF_ERROR(dev_->Pipeline(k).status());
    }
    std::vector<size_t> used = lease_buffers_;
    if (first_ == 0) {
      for (size_t i = 0; i < layout_->buffers.size(); ++i) used.push_back(i);
    }
    for (size_t i : used) {
      const GgmlType t = layout_->buffer_type(i);
      if (TypeSuffix(t).empty()) {
        return InvalidArgumentError(fmt::format(
            "device {}: tensor {} is {}, a type the Vulkan kernels do not read yet (f32, f16, "
            "bf16, q8_0, q4_0, q4_1, q5_0, q5_1, q4_k, q5_k, q6_k); use device \"cpu\" for this "
            "model",
            domain_, layout_->buffers[i].name, GgmlTypeName(t)));
      }
    }
    return OkStatus();
  }

  std::string_view device() const override { return domain_; }
  std::string_view memory_domain() const override { return domain_; }
  const ModelDims& dims() const override { return dims_; }
  GgmlType kv_type() const override { return GgmlType::kF16; }
  int n_ctx() const override { return spec_.n_ctx; }
  SlotFootprint slot_footprint() const override { return footprint_; }

  Result<std::unique_ptr<ComputeSlot>> CreateSlot() override {
    auto slot = std::make_unique<VulkanSlot>(dev_, footprint_);
    ARBITER_ASSIGN_OR_RETURN(slot->kv, dev_->CreateBuffer(footprint_.kv_bytes, BufferMemory::kDevice));
    ARBITER_ASSIGN_OR_RETURN(slot->scratch,
                             dev_->CreateBuffer(scratch_.total * 4, BufferMemory::kDevice));
    ARBITER_ASSIGN_OR_RETURN(slot->out,
                             dev_->CreateBuffer(outl_.total, BufferMemory::kReadback));
    ARBITER_ASSIGN_OR_RETURN(slot->pool, dev_->CreateCommandPool());
    // The decode attention's counts start at zero (its last workgroup per
    // head puts them back).
    const VkBuffer scratch = slot->scratch.buffer;
    ARBITER_RETURN_IF_ERROR(dev_->RunOnce([&](VkCommandBuffer cb) {
      vkCmdFillBuffer(cb, scratch, 4 * scratch_.count, 4 * static_cast<uint64_t>(dims_.n_heads), 0);
    }));
    return std::unique_ptr<ComputeSlot>(std::move(slot));
  }

  Result<std::unique_ptr<ComputeWeights>> BindWeights(const WeightLease& lease,
                                                      const std::string& key) const override {
    const size_t want = first_ > 0 ? lease_buffers_.size() : layout_->buffers.size();
    if (lease.size() != want) {
      return FailedPreconditionError(fmt::format(
          "weights '{}' have {} tensors but the model's compute layout {} {}", key,
          lease.size(), first_ > 0 ? "puts on the device" : "has", want));
    }
    auto* backend = dynamic_cast<vulkan::VulkanDeviceBackend*>(lease.device());
    if (backend == nullptr || backend->device().get() != dev_.get()) {
      return FailedPreconditionError(fmt::format(
          "weights '{}' are not in {}'s memory; load the model with device \"{}\" so its "
          "weight cache is on that device",
          key, domain_, domain_));
    }
    auto w = std::make_unique<VulkanWeights>();
    uint64_t h = 1469598103934665603ull;
    // A split's device part holds lease_buffers_ only; the host's buffers
    // have address 0 (never read here).
    w->addr.assign(layout_->buffers.size(), 0);
    for (size_t i = 0; i < lease.size(); ++i) {
      ARBITER_ASSIGN_OR_RETURN(uint64_t a, backend->Address(lease.region(), lease.device_offset(i)));
      w->addr[first_ > 0 ? lease_buffers_[i] : i] = a;
      h = (h ^ a) * 1099511628211ull;
    }
    w->id = h == 0 ? 1 : h;
    return std::unique_ptr<ComputeWeights>(std::move(w));
  }

  Status Prefill(const ComputeWeights& w, ComputeSlot& slot, const int32_t* tokens, int n,
                 int pos, const ForwardOutputs& out) override {
    if (first_ > 0) return InternalError("a split's device part takes hidden rows");
    return Run(w, slot, tokens, nullptr, n, pos, out);
  }
  Status PrefillHidden(const ComputeWeights& w, ComputeSlot& slot, const float* x, int n, int pos,
                       const ForwardOutputs& out) override {
    if (first_ == 0) return InternalError("a whole model's compute takes token ids");
    return Run(w, slot, nullptr, x, n, pos, out);
  }
  Status Decode(const ComputeWeights& w, ComputeSlot& slot, int32_t token, int pos,
                float* logits) override {
    if (first_ > 0) return InternalError("a split's device part takes hidden rows");
    return Step(w, slot, &token, nullptr, pos, logits);
  }
  Status DecodeHidden(const ComputeWeights& w, ComputeSlot& slot, const float* x, int pos,
                      float* logits) override {
    if (first_ == 0) return InternalError("a whole model's compute takes token ids");
    return Step(w, slot, nullptr, x, pos, logits);
  }

  // Prefill of `tokens` [n], or (a split's device part) of the hidden rows
  // `x` [n, hidden] entering first_.
  Status Run(const ComputeWeights& w, ComputeSlot& slot, const int32_t* tokens, const float* x,
             int n, int pos, const ForwardOutputs& out) {
    auto& s = static_cast<VulkanSlot&>(slot);
    const auto& vw = static_cast<const VulkanWeights&>(w);
    const size_t vocab = static_cast<size_t>(dims_.vocab);
    // All logits go to a readback buffer of one chunk's rows made for this
    // call; chunks shrink so that it stays within kAllLogitsBytes.
    int chunk = spec_.batch;
    VulkanBuffer all;
    if (out.all_logits != nullptr && layout_->has_lm_head) {
      chunk = static_cast<int>(std::clamp<size_t>(kAllLogitsBytes / (4 * vocab), 1,
                                                  static_cast<size_t>(spec_.batch)));
      ARBITER_ASSIGN_OR_RETURN(all, dev_->CreateBuffer(size_t{4} * vocab * std::min(n, chunk),
                                                       BufferMemory::kReadback));
    }
    Status st = OkStatus();
    for (int c0 = 0; c0 < n && st.ok(); c0 += chunk) {
      const int m = std::min(chunk, n - c0);
      const bool last = c0 + m == n;
      Logits lg = Logits::kNone;
      if (all.buffer != VK_NULL_HANDLE) lg = Logits::kAll;
      else if (last && out.last_logits != nullptr && layout_->has_lm_head) lg = Logits::kLast;
      auto* host = static_cast<uint8_t*>(s.out.host);
      const auto p = static_cast<uint32_t>(pos + c0);
      std::memcpy(host, &p, 4);
      if (x != nullptr) {
        std::memcpy(host + outl_.hidden, x + size_t{1} * c0 * dims_.hidden,
                    size_t{4} * m * dims_.hidden);
      } else {
        std::memcpy(host + outl_.tokens, tokens + c0, size_t{4} * m);
      }
      st = Record(vw, s, 1, m, lg, all.address);
      if (st.ok()) st = dev_->SubmitAndWait(s.cbs[1]);
      if (!st.ok()) break;
      if (profile_) Collect(s, 1, m);
      if (lg == Logits::kAll) {
        std::memcpy(out.all_logits + size_t{1} * c0 * vocab, all.host, size_t{4} * m * vocab);
        if (last && out.last_logits != nullptr) {
          std::memcpy(out.last_logits, static_cast<const float*>(all.host) + (m - 1) * vocab,
                      4 * vocab);
        }
      } else if (lg == Logits::kLast) {
        std::memcpy(out.last_logits, host + outl_.logits, 4 * vocab);
      }
      if (out.hidden_sum != nullptr) {
        const auto* hid = reinterpret_cast<const float*>(host + outl_.hidden);
        for (int r = 0; r < m; ++r) {
          for (int i = 0; i < dims_.hidden; ++i) {
            out.hidden_sum[i] += hid[size_t{1} * r * dims_.hidden + i];
          }
        }
      }
    }
    if (all.buffer != VK_NULL_HANDLE) dev_->Destroy(all);
    return st;
  }

  // One decode step of `*token`, or of the hidden row `x` [hidden].
  Status Step(const ComputeWeights& w, ComputeSlot& slot, const int32_t* token, const float* x,
              int pos, float* logits) {
    auto& s = static_cast<VulkanSlot&>(slot);
    const auto& vw = static_cast<const VulkanWeights&>(w);
    if (s.decode_for != vw.id) {
      ARBITER_RETURN_IF_ERROR(Record(vw, s, 0, 1, Logits::kLast, 0));
      s.decode_for = vw.id;
    }
    auto* host = static_cast<uint8_t*>(s.out.host);
    const auto p = static_cast<uint32_t>(pos);
    std::memcpy(host, &p, 4);
    if (x != nullptr) {
      std::memcpy(host + outl_.hidden, x, size_t{4} * dims_.hidden);
    } else {
      std::memcpy(host + outl_.tokens, token, 4);
    }
    ARBITER_RETURN_IF_ERROR(dev_->SubmitAndWait(s.cbs[0]));
    if (profile_) Collect(s, 0, 1);
    std::memcpy(logits, host + outl_.logits, size_t{4} * dims_.vocab);
    return OkStatus();
  }

  void CopyKv(const ComputeSlot& src, ComputeSlot& dst, int begin, int end) override {
    if (end <= begin) return;
    const auto& a = static_cast<const VulkanSlot&>(src);
    auto& b = static_cast<VulkanSlot&>(dst);
    const size_t row = KvRowBytesF16(dims_);
    std::vector<VkBufferCopy> regions;
    for (int l = 0; l < 2 * n_kv_layers_; ++l) {
      const uint64_t off = (uint64_t{1} * l * spec_.n_ctx + begin) * row;
      regions.push_back({off, off, uint64_t{1} * (end - begin) * row});
    }
    dev_->RunOnce([&](VkCommandBuffer cb) {
      vkCmdCopyBuffer(cb, a.kv.buffer, b.kv.buffer, static_cast<uint32_t>(regions.size()),
                      regions.data());
    }).IgnoreError();
  }

  void ReadKv(const ComputeSlot& slot, int n, uint8_t* out) override {
    MoveKv(const_cast<VulkanSlot&>(static_cast<const VulkanSlot&>(slot)), n, out, true)
        .IgnoreError();
  }
  void WriteKv(ComputeSlot& slot, int n, const uint8_t* in) override {
    MoveKv(static_cast<VulkanSlot&>(slot), n, const_cast<uint8_t*>(in), false).IgnoreError();
  }
  Status VisitKv(const ComputeSlot& slot, KvRowsView rows,
                 const std::function<Status(const KvRowsView&)>& visit) override {
    const size_t row = KvRowBytesF16(dims_);
    const size_t n = rows.n_tokens;
    std::vector<uint8_t> host(size_t{2} * n_kv_layers_ * n * row);
    ARBITER_RETURN_IF_ERROR(MoveKv(const_cast<VulkanSlot&>(static_cast<const VulkanSlot&>(slot)),
                                   static_cast<int>(n), host.data(), true));
    rows.k.assign(static_cast<size_t>(n_kv_layers_), nullptr);
    rows.v.assign(static_cast<size_t>(n_kv_layers_), nullptr);
    rows.n_layers = static_cast<uint32_t>(n_kv_layers_);
    for (int l = 0; l < n_kv_layers_; ++l) {
      rows.k[static_cast<size_t>(l)] = host.data() + (size_t{2} * l) * n * row;
      rows.v[static_cast<size_t>(l)] = host.data() + (size_t{2} * l + 1) * n * row;
    }
    return visit(rows);
  }

 private:
  // Profiling (Note [Vulkan profiling]).
  // A query pool in `s` for two command buffers of up to `n` timestamps.
  Status EnsureQueries(VulkanSlot& s, uint32_t n) {
    if (s.query_half >= n) return OkStatus();
    // The pool is remade: both recordings must be remade with it.
    if (s.queries != VK_NULL_HANDLE) vkDestroyQueryPool(dev_->device(), s.queries, nullptr);
    s.queries = VK_NULL_HANDLE;
    s.query_half = 0;
    s.decode_for = 0;
    VkQueryPoolCreateInfo qi{VK_STRUCTURE_TYPE_QUERY_POOL_CREATE_INFO};
    qi.queryType = VK_QUERY_TYPE_TIMESTAMP;
    qi.queryCount = 2 * (n + 64);
    if (VkResult r = vkCreateQueryPool(dev_->device(), &qi, nullptr, &s.queries); r != VK_SUCCESS) {
      s.queries = VK_NULL_HANDLE;
      return ResourceExhaustedError("device " + domain_ + ": no timestamp query pool");
    }
    s.query_half = n + 64;
    return OkStatus();
  }

  // Adds the timestamps of cbs[which]'s last run (m tokens) to the totals.
  void Collect(VulkanSlot& s, int which, int m) {
    const auto w = static_cast<size_t>(which);
    const auto n = static_cast<uint32_t>(s.names[w].size()) + 1;
    std::vector<uint64_t> ts(n);
    if (vkGetQueryPoolResults(dev_->device(), s.queries, static_cast<uint32_t>(w) * s.query_half,
                              n, n * sizeof(uint64_t), ts.data(), sizeof(uint64_t),
                              VK_QUERY_RESULT_64_BIT | VK_QUERY_RESULT_WAIT_BIT) != VK_SUCCESS) {
      return;
    }
    const uint32_t bits = dev_->timestamp_valid_bits();
    const uint64_t mask = bits >= 64 ? ~uint64_t{0} : (uint64_t{1} << bits) - 1;
    const double ns_per_tick = dev_->timestamp_period_ns();
    bool report = false;
    {
      MutexLock l(&profile_mu_);
      ProfileTotals& t = profile_totals_[w];
      t.runs += 1;
      t.tokens += static_cast<uint64_t>(m);
      for (uint32_t i = 1; i < n; ++i) {
        const double ns = static_cast<double>((ts[i] - ts[i - 1]) & mask) * ns_per_tick;
        ProfileTotals::PerKernel& k = t.kernels[s.names[w][i - 1]];
        k.calls += 1;
        k.ns += ns;
        t.ns += ns;
      }
      report = which == 0 && profile_every_ > 0 && t.runs % profile_every_ == 0;
    }
    if (report) LogProfile();
  }

  // Logs the totals at warn level (what `arbiter bench` shows).
  void LogProfile() {
    MutexLock l(&profile_mu_);
    static constexpr const char* kWhat[2] = {"decode", "prefill"};
    for (size_t w = 0; w < 2; ++w) {
      const ProfileTotals& t = profile_totals_[w];
      if (t.runs == 0) continue;
      std::string msg = fmt::format(
          "vulkan profile ({}): {} — {} submissions, {} tokens, {:.3f} ms GPU in all, {:.1f} us "
          "per submission, {:.1f} us per token",
          domain_, kWhat[w], t.runs, t.tokens, t.ns / 1e6, t.ns / 1e3 / static_cast<double>(t.runs),
          t.ns / 1e3 / static_cast<double>(t.tokens));
      std::vector<std::pair<std::string, ProfileTotals::PerKernel>> ks(t.kernels.begin(),
                                                                      t.kernels.end());
      std::sort(ks.begin(), ks.end(),
                [](const auto& a, const auto& b) { return a.second.ns > b.second.ns; });
      for (const auto& [name, k] : ks) {
        msg += fmt::format("\n  {:<26} {:>5.1f}%  {:>10.1f} us per submission  {:>8} dispatches",
                           name, t.ns > 0 ? 100.0 * k.ns / t.ns : 0.0,
                           k.ns / 1e3 / static_cast<double>(t.runs), k.calls);
      }
      spdlog::warn("{}", msg);
    }
  }

  // The kernel of shader `name`.
  Result<Kernel> K(std::string name) {
    ARBITER_ASSIGN_OR_RETURN(VkPipeline p, dev_->Pipeline(name));
    return Kernel{std::move(name), p};
  }

  // The most bytes of the all-logits readback buffer of one Prefill call.
  static constexpr size_t kAllLogitsBytes = size_t{64} << 20;

  // Which logits a recorded pass computes.
  enum class Logits { kNone, kLast, kAll };

  // Rows [0, n) of every layer between the slot and host `data` (the
  // kv_snapshot layout), through a staging buffer.
  Status MoveKv(VulkanSlot& s, int n, uint8_t* data, bool to_host) {
    if (n <= 0) return OkStatus();
    const size_t row = KvRowBytesF16(dims_);
    const uint64_t bytes = uint64_t{2} * n_kv_layers_ * n * row;
    ARBITER_ASSIGN_OR_RETURN(
        VulkanBuffer staging,
        dev_->CreateBuffer(bytes, to_host ? BufferMemory::kReadback : BufferMemory::kUpload));
    std::vector<VkBufferCopy> regions;
    for (int l = 0; l < 2 * n_kv_layers_; ++l) {
      const uint64_t dev_off = uint64_t{1} * l * spec_.n_ctx * row;
      const uint64_t host_off = uint64_t{1} * l * n * row;
      regions.push_back(to_host ? VkBufferCopy{dev_off, host_off, uint64_t{1} * n * row}
                                : VkBufferCopy{host_off, dev_off, uint64_t{1} * n * row});
    }
    if (!to_host) std::memcpy(staging.host, data, bytes);
    Status st = dev_->RunOnce([&](VkCommandBuffer cb) {
      vkCmdCopyBuffer(cb, to_host ? s.kv.buffer : staging.buffer,
                      to_host ? staging.buffer : s.kv.buffer,
                      static_cast<uint32_t>(regions.size()), regions.data());
    });
    if (st.ok() && to_host) std::memcpy(data, staging.host, bytes);
    dev_->Destroy(staging);
    return st;
  }

  // The matrix `mat`'s segments applied to m rows of activations x (ldx
  // floats apart) into y (ldy floats apart; += when accumulate): matvec
  // dispatches for one row (decode), GEMM dispatches for a prefill chunk.
  Status AddProjection(std::string_view role, std::vector<Dispatch>& out, const VulkanWeights& w,
                       const MatrixBuffers& mat, int cols, uint64_t x, uint64_t y, uint64_t bias,
                       bool accumulate, bool gemm, int m, int ldx, int ldy,
                       const MatvecFusion& fuse = {}) {
    uint32_t row0 = 0;
    for (int k = 0; k < mat.n; ++k) {
      const auto b = static_cast<size_t>(mat.buffer[static_cast<size_t>(k)]);
      const GgmlType t = layout_->buffer_type(b);
      const auto rows = static_cast<uint32_t>(layout_->buffers[b].shape.front());
      const auto row_bytes = static_cast<uint32_t>(GgmlRowBytes(t, cols).value_or(0));
      const uint64_t yk = y + uint64_t{4} * row0;
      const uint64_t bk = bias == 0 ? 0 : bias + uint64_t{4} * row0;
      const bool plain = t == GgmlType::kF32 || t == GgmlType::kF16 || t == GgmlType::kBF16;
      if (gemm) {
        ARBITER_ASSIGN_OR_RETURN(Kernel p, K(gemm_.prefix + std::string(TypeSuffix(t))));
        GemmPush push{.w = w.addr[b],
                      .x = x,
                      .y = yk,
                      .bias = bk,
                      .rows = rows,
                      .cols = static_cast<uint32_t>(cols),
                      .row_bytes = row_bytes,
                      .accumulate = accumulate ? 1u : 0u,
                      .m = static_cast<uint32_t>(m),
                      .ldx = static_cast<uint32_t>(ldx),
                      .ldy = static_cast<uint32_t>(ldy),
                      .wvec = plain && w.addr[b] % 16 == 0 && row_bytes % 16 == 0 ? 1u : 0u,
                      .xvec = x % 16 == 0 && ldx % 4 == 0 ? 1u : 0u};
        out.push_back({p, Bytes(push), (rows + gemm_.tile_rows - 1) / gemm_.tile_rows,
                       (static_cast<uint32_t>(m) + gemm_.tile_m - 1) / gemm_.tile_m});
      } else {
        ARBITER_ASSIGN_OR_RETURN(Kernel p, K("matvec_" + std::string(TypeSuffix(t))));
        const bool vec4 = plain && w.addr[b] % 16 == 0 && row_bytes % 16 == 0 && x % 16 == 0;
        if (fuse.mode != 0 && !vec4) return InternalError("a fused matvec needs 16-byte rows");
        MatvecPush push{.w = w.addr[b],
                        .x = x,
                        .y = yk,
                        .bias = bk,
                        .norm = fuse.norm,
                        .rows = rows,
                        .cols = static_cast<uint32_t>(cols),
                        .row_bytes = row_bytes,
                        .accumulate = accumulate ? 1u : 0u,
                        .vec4 = vec4 ? 1u : 0u,
                        .mode = fuse.mode,
                        .eps = fuse.eps};
        const uint32_t groups = (rows + kMatvecRows - 1) / kMatvecRows;
        out.push_back(
            {p, Bytes(push), std::min<uint32_t>(groups, 32768), (groups + 32767) / 32768});
      }
      out.back().barrier = k + 1 == mat.n;
      // The profile's key: the shader and what it computes here.
      out.back().kernel.name += fmt::format(" {}{}", role,
                                            fuse.mode == 1   ? "+norm"
                                            : fuse.mode == 2 ? "+silu"
                                                             : "");
      row0 += rows;
    }
    return OkStatus();
  }

  // Whether every segment of `mat` takes matvec.comp's 16-byte path (and so
  // its fusions) with x at `x`.
  bool Vec4Rows(const VulkanWeights& w, const MatrixBuffers& mat, int cols, uint64_t x) const {
    if (x % 16 != 0) return false;
    for (int k = 0; k < mat.n; ++k) {
      const auto b = static_cast<size_t>(mat.buffer[static_cast<size_t>(k)]);
      const GgmlType t = layout_->buffer_type(b);
      if (t != GgmlType::kF32 && t != GgmlType::kF16 && t != GgmlType::kBF16) return false;
      if (w.addr[b] % 16 != 0 || GgmlRowBytes(t, cols).value_or(1) % 16 != 0) return false;
    }
    return true;
  }

  // Records s.cbs[which]: m tokens (ids at the step's token area, the first
  // at the step's pos) through every layer; decode (which 0, m = 1) with
  // matvecs and split attention, a prefill chunk (which 1) with GEMMs.
  // Logits: kLast → the last row's into the slot's logits; kAll → every
  // row's into `all_logits` [m, vocab]. The final-normed rows always go to
  // the slot's hidden rows.
  Status Record(const VulkanWeights& w, VulkanSlot& s, int which, int m, Logits lg,
                uint64_t all_logits) {
    const ModelDims& d = dims_;
    const bool gemm = which == 1;
    const uint64_t base = s.scratch.address;
    const uint64_t x = base + 4 * scratch_.x, xn = base + 4 * scratch_.xn,
                   qkv = base + 4 * scratch_.qkv, att = base + 4 * scratch_.att,
                   gu = base + 4 * scratch_.gu, act = base + 4 * scratch_.act,
                   part = base + 4 * scratch_.part, count = base + 4 * scratch_.count;
    const uint64_t step = s.out.address;
    const uint64_t tokens = s.out.address + outl_.tokens;
    const uint64_t logits = s.out.address + outl_.logits;
    const float eps = layout_->config.rms_norm_eps;
    const auto um = static_cast<uint32_t>(m);
    const uint32_t splits = gemm ? 1 : decode_splits_;
    auto addr = [&](int b) -> uint64_t { return b < 0 ? 0 : w.addr[static_cast<size_t>(b)]; };
    std::vector<Dispatch> ds;
    ARBITER_ASSIGN_OR_RETURN(Kernel rms, K("rmsnorm"));
    ARBITER_ASSIGN_OR_RETURN(Kernel rope, K("rope_kv"));
    ARBITER_ASSIGN_OR_RETURN(Kernel attn, K("attention"));
    ARBITER_ASSIGN_OR_RETURN(Kernel silu, K("silu_mul"));
    if (first_ == 0) {
      const auto b = static_cast<size_t>(layout_->embed.buffer[0]);
      const GgmlType t = layout_->buffer_type(b);
      ARBITER_ASSIGN_OR_RETURN(Kernel p, K("embed_" + std::string(TypeSuffix(t))));
      EmbedPush push{.w = w.addr[b],
                     .out = x,
                     .tokens = tokens,
                     .rows = static_cast<uint32_t>(d.vocab),
                     .cols = static_cast<uint32_t>(d.hidden),
                     .row_bytes = static_cast<uint32_t>(GgmlRowBytes(t, d.hidden).value_or(0))};
      ds.push_back({p, Bytes(push), 1, um});
    }
    const size_t row = KvRowBytesF16(d);
    for (int l = first_; l < d.n_layers; ++l) {
      const LayerBuffers& lb = layout_->layers[static_cast<size_t>(l)];
      const uint64_t kc = s.kv.address + uint64_t{2} * (l - first_) * spec_.n_ctx * row;
      const uint64_t vc = kc + uint64_t{1} * spec_.n_ctx * row;
      // Decode folds each RMSNorm into the projection after it, and
      // silu·up into the down projection, where the rows allow.
      if (!gemm && Vec4Rows(w, lb.wqkv, d.hidden, x)) {
        ARBITER_RETURN_IF_ERROR(AddProjection("qkv", ds, w, lb.wqkv, d.hidden, x, qkv,
                                              addr(lb.bqkv), false, false, 1, d.hidden, d.qkv_dim,
                                              {1, addr(lb.attn_norm), eps}));
      } else {
        ds.push_back(
            {rms, Bytes(NormPush{x, addr(lb.attn_norm), xn, uint32_t(d.hidden), eps}), um, 1});
        ARBITER_RETURN_IF_ERROR(AddProjection("qkv", ds, w, lb.wqkv, d.hidden, xn, qkv,
                                              addr(lb.bqkv), false, gemm, m, d.hidden, d.qkv_dim));
      }
      ds.push_back({rope,
                    Bytes(RopePush{qkv, addr(lb.q_norm), addr(lb.k_norm), rope_.address, kc, vc,
                                   step, uint32_t(d.n_heads), uint32_t(d.n_kv_heads),
                                   uint32_t(d.head_dim), uint32_t(spec_.n_ctx), eps}),
                    uint32_t(d.n_heads + 2 * d.n_kv_heads), um});
      ds.push_back({attn,
                    Bytes(AttnPush{qkv, kc, vc, part, count, att, step, uint32_t(d.n_heads),
                                   uint32_t(d.n_kv_heads), uint32_t(d.head_dim), splits,
                                   1.0f / std::sqrt(static_cast<float>(d.head_dim))}),
                    splits, uint32_t(d.n_heads), um});
      ARBITER_RETURN_IF_ERROR(
          AddProjection("wo", ds, w, lb.wo, d.q_dim, att, x, 0, true, gemm, m, d.q_dim, d.hidden));
      if (!gemm && Vec4Rows(w, lb.w_gate_up, d.hidden, x)) {
        ARBITER_RETURN_IF_ERROR(AddProjection("gate_up", ds, w, lb.w_gate_up, d.hidden, x, gu, 0,
                                              false, false, 1, d.hidden, 2 * d.inter,
                                              {1, addr(lb.ffn_norm), eps}));
      } else {
        ds.push_back(
            {rms, Bytes(NormPush{x, addr(lb.ffn_norm), xn, uint32_t(d.hidden), eps}), um, 1});
        ARBITER_RETURN_IF_ERROR(AddProjection("gate_up", ds, w, lb.w_gate_up, d.hidden, xn, gu, 0,
                                              false, gemm, m, d.hidden, 2 * d.inter));
      }
      if (!gemm && d.inter % 4 == 0 && Vec4Rows(w, lb.w_down, d.inter, gu)) {
        ARBITER_RETURN_IF_ERROR(AddProjection("down", ds, w, lb.w_down, d.inter, gu, x, 0, true,
                                              false, 1, d.inter, d.hidden, {2, 0, 0}));
      } else {
        ds.push_back({silu, Bytes(SiluPush{gu, act, uint32_t(d.inter)}),
                      uint32_t((d.inter + 255) / 256), um});
        ARBITER_RETURN_IF_ERROR(AddProjection("down", ds, w, lb.w_down, d.inter, act, x, 0, true,
                                              gemm, m, d.inter, d.hidden));
      }
    }
    // The final norm into device memory (the lm_head reads it once per
    // row), copied to the host-visible hidden rows at the end.
    ds.push_back(
        {rms, Bytes(NormPush{x, addr(layout_->final_norm), xn, uint32_t(d.hidden), eps}), um, 1});
    const MatrixBuffers& head = layout_->lm_head.n > 0 ? layout_->lm_head : layout_->embed;
    if (lg == Logits::kLast) {
      const uint64_t last = xn + uint64_t{4} * (m - 1) * d.hidden;
      ARBITER_RETURN_IF_ERROR(AddProjection("lm_head", ds, w, head, d.hidden, last, logits, 0,
                                            false, false, 1, d.hidden, d.vocab));
    } else if (lg == Logits::kAll) {
      ARBITER_RETURN_IF_ERROR(AddProjection("lm_head", ds, w, head, d.hidden, xn, all_logits, 0,
                                            false, true, m, d.hidden, d.vocab));
    }
    const size_t variant = static_cast<size_t>(which);
    VkCommandBuffer& cb = s.cbs[variant];
    if (cb == VK_NULL_HANDLE) {
      VkCommandBufferAllocateInfo ai{VK_STRUCTURE_TYPE_COMMAND_BUFFER_ALLOCATE_INFO};
      ai.commandPool = s.pool;
      ai.level = VK_COMMAND_BUFFER_LEVEL_PRIMARY;
      ai.commandBufferCount = 1;
      if (vkAllocateCommandBuffers(dev_->device(), &ai, &cb) != VK_SUCCESS) {
        cb = VK_NULL_HANDLE;
        return ResourceExhaustedError("device " + domain_ + ": no command buffer");
      }
    } else {
      vkResetCommandBuffer(cb, 0);
    }
    VkCommandBufferBeginInfo bi{VK_STRUCTURE_TYPE_COMMAND_BUFFER_BEGIN_INFO};
    vkBeginCommandBuffer(cb, &bi);
    if (first_ > 0) {
      // A split's device part: the host's residual rows (written to the
      // hidden rows before the submission) are the input x.
      const VkBufferCopy in{outl_.hidden, 4 * scratch_.x, uint64_t{4} * m * d.hidden};
      vkCmdCopyBuffer(cb, s.out.buffer, s.scratch.buffer, 1, &in);
      VkMemoryBarrier ib{VK_STRUCTURE_TYPE_MEMORY_BARRIER};
      ib.srcAccessMask = VK_ACCESS_TRANSFER_WRITE_BIT;
      ib.dstAccessMask = VK_ACCESS_SHADER_READ_BIT | VK_ACCESS_SHADER_WRITE_BIT;
      vkCmdPipelineBarrier(cb, VK_PIPELINE_STAGE_TRANSFER_BIT, VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT,
                           0, 1, &ib, 0, nullptr, 0, nullptr);
    }
    uint32_t q0 = 0;
    if (profile_) {
      ARBITER_RETURN_IF_ERROR(EnsureQueries(s, static_cast<uint32_t>(ds.size()) + 1));
      q0 = static_cast<uint32_t>(variant) * s.query_half;
      s.names[variant].clear();
      for (const Dispatch& dsp : ds) s.names[variant].push_back(dsp.kernel.name);
      vkCmdResetQueryPool(cb, s.queries, q0, static_cast<uint32_t>(ds.size()) + 1);
      vkCmdWriteTimestamp(cb, VK_PIPELINE_STAGE_TOP_OF_PIPE_BIT, s.queries, q0);
    }
    VkMemoryBarrier mb{VK_STRUCTURE_TYPE_MEMORY_BARRIER};
    mb.srcAccessMask = VK_ACCESS_SHADER_WRITE_BIT;
    mb.dstAccessMask = VK_ACCESS_SHADER_READ_BIT | VK_ACCESS_SHADER_WRITE_BIT;
    VkPipeline bound = VK_NULL_HANDLE;
    uint32_t q = q0;
    for (const Dispatch& dsp : ds) {
      if (dsp.kernel.pipeline != bound) {
        vkCmdBindPipeline(cb, VK_PIPELINE_BIND_POINT_COMPUTE, dsp.kernel.pipeline);
        bound = dsp.kernel.pipeline;
      }
      vkCmdPushConstants(cb, dev_->pipeline_layout(), VK_SHADER_STAGE_COMPUTE_BIT, 0,
                         static_cast<uint32_t>(dsp.push.size()), dsp.push.data());
      vkCmdDispatch(cb, dsp.gx, dsp.gy, dsp.gz);
      if (dsp.barrier) {
        vkCmdPipelineBarrier(cb, VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT,
                             VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT, 0, 1, &mb, 0, nullptr, 0,
                             nullptr);
      }
      if (profile_) vkCmdWriteTimestamp(cb, VK_PIPELINE_STAGE_BOTTOM_OF_PIPE_BIT, s.queries, ++q);
    }
    VkMemoryBarrier tb{VK_STRUCTURE_TYPE_MEMORY_BARRIER};
    tb.srcAccessMask = VK_ACCESS_SHADER_WRITE_BIT;
    tb.dstAccessMask = VK_ACCESS_TRANSFER_READ_BIT;
    vkCmdPipelineBarrier(cb, VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT, VK_PIPELINE_STAGE_TRANSFER_BIT,
                         0, 1, &tb, 0, nullptr, 0, nullptr);
    const VkBufferCopy hc{4 * scratch_.xn, outl_.hidden, uint64_t{4} * m * d.hidden};
    vkCmdCopyBuffer(cb, s.scratch.buffer, s.out.buffer, 1, &hc);
    VkMemoryBarrier hb{VK_STRUCTURE_TYPE_MEMORY_BARRIER};
    hb.srcAccessMask = VK_ACCESS_SHADER_WRITE_BIT | VK_ACCESS_TRANSFER_WRITE_BIT;
    hb.dstAccessMask = VK_ACCESS_HOST_READ_BIT;
    vkCmdPipelineBarrier(cb, VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT | VK_PIPELINE_STAGE_TRANSFER_BIT,
                         VK_PIPELINE_STAGE_HOST_BIT, 0, 1, &hb, 0, nullptr, 0, nullptr);
    if (vkEndCommandBuffer(cb) != VK_SUCCESS) {
      return InternalError("device " + domain_ + ": recording the forward pass failed");
    }
    return OkStatus();
  }

  const ComputeSpec spec_;
  const std::shared_ptr<const ComputeLayout> layout_;
  const ModelDims dims_;
  const std::shared_ptr<VulkanDevice> dev_;
  const std::string domain_;
  const SlotFootprint footprint_;
  const ScratchLayout scratch_;
  const OutLayout outl_;
  const uint32_t decode_splits_;
  vulkan::GemmKernels gemm_ = vulkan::Fp32Gemm();  // the prefill GEMM (Init)
  // A split's device part (Note [Partial offload] in split_compute.cc):
  // layers [first_, n_layers) run here, their KV only in the slots
  // (n_kv_layers_), and the lease holds lease_buffers_ in order. first_ 0:
  // the whole model.
  const int first_;
  const int n_kv_layers_;
  std::vector<size_t> lease_buffers_;
  VulkanBuffer rope_;

  // Profiling: on when ARBITER_VULKAN_PROFILE is set (not "0") and the
  // queue has timestamps; every profile_every_ decode steps (and at the
  // end) the totals are logged.
  bool profile_ = false;
  uint64_t profile_every_ = 0;
  struct ProfileTotals {
    struct PerKernel {
      uint64_t calls = 0;
      double ns = 0;
    };
    uint64_t runs = 0, tokens = 0;
    double ns = 0;
    std::map<std::string, PerKernel> kernels;
  };
  Mutex profile_mu_;
  ProfileTotals profile_totals_[2] GUARDED_BY(profile_mu_);  // [0] decode, [1] prefill
};

}  // namespace

bool VulkanComputeBuilt() { return true; }

SlotFootprint VulkanSlotFootprint(const ComputeSpec& spec) {
  const ModelDims& d = spec.layout->dims;
  SlotFootprint f;
  const int n_layers = d.n_layers - std::clamp(spec.first_layer, 0, d.n_layers);
  f.kv_bytes_per_token = size_t{2} * n_layers * KvRowBytesF16(d);
  f.kv_bytes = f.kv_bytes_per_token * static_cast<size_t>(spec.n_ctx);
  f.scratch_bytes =
      ScratchFor(d, spec.batch, spec.n_ctx).total * 4 + OutFor(d, spec.batch).total;
  return f;
}

Result<std::unique_ptr<DeviceBackend>> MakeVulkanWeightArena(std::string_view device,
                                                             uint64_t heap_bytes) {
  ARBITER_ASSIGN_OR_RETURN(std::shared_ptr<VulkanDevice> dev, VulkanDevice::Open(device));
  ARBITER_ASSIGN_OR_RETURN(std::unique_ptr<vulkan::VulkanDeviceBackend> b,
                           vulkan::VulkanDeviceBackend::Create(std::move(dev),
                                                               {.heap_bytes = heap_bytes}));
  return std::unique_ptr<DeviceBackend>(std::move(b));
}

Result<std::unique_ptr<DecoderCompute>> MakeVulkanDecoderCompute(const ComputeSpec& spec) {
  if (spec.kv_type != GgmlType::kF16) {
    return InvalidArgumentError(fmt::format(
        "kv_type \"{}\" is not supported on device \"{}\": the Vulkan kernels keep the KV cache "
        "in f16 (set kv_type = \"f16\")",
        GgmlTypeName(spec.kv_type), spec.device));
  }
  if (spec.layout->dims.head_dim > 512 || spec.layout->dims.head_dim % 2 != 0) {
    return InvalidArgumentError(fmt::format("device \"{}\": head_dim {} (the kernels take even "
                                            "head_dim up to 512)",
                                            spec.device, spec.layout->dims.head_dim));
  }
  ARBITER_ASSIGN_OR_RETURN(std::shared_ptr<VulkanDevice> dev, VulkanDevice::Open(spec.device));
  auto c = std::make_unique<VulkanDecoderCompute>(spec, std::move(dev));
  ARBITER_RETURN_IF_ERROR(c->Init());
  return std::unique_ptr<DecoderCompute>(std::move(c));
}

}  // namespace arbiter::engine_internal

#else  // !ARBITER_HAS_VULKAN

namespace arbiter::engine_internal {

bool VulkanComputeBuilt() { return false; }
Result<std::unique_ptr<DeviceBackend>> MakeVulkanWeightArena(std::string_view device, uint64_t) {
  return UnavailableError("device \"" + std::string(device) + "\": this build has no Vulkan device");
}
SlotFootprint VulkanSlotFootprint(const ComputeSpec&) { return {}; }
Result<std::unique_ptr<DecoderCompute>> MakeVulkanDecoderCompute(const ComputeSpec& spec) {
  return UnavailableError("device \"" + spec.device +
                          "\": this build has no Vulkan device (configure with ARBITER_VULKAN=ON "
                          "after scripts/install-deps.sh); use device \"cpu\"");
}

}  // namespace arbiter::engine_internal

#endif
