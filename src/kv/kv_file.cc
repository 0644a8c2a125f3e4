// kv/kv_file.cc — the v1 KV file: write atomically, read with every field
// checked (see kv_file.h for the layout).
#include "arbiter/kv/kv_file.h"

#include <bit>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <thread>

#include <fmt/format.h>
#include <spdlog/spdlog.h>
#include <xxhash.h>

#include "arbiter/base/file.h"

namespace arbiter {
namespace {

// Fault injection for tests (docs/config.md "Fault-injection hooks"):
// ARBITER_TEST_KV_WRITE_DELAY_MS=N makes every KV file write sleep N ms
// after its header and tokens reached the temp file, so a test can kill the
// process in the middle of a save. Inert unless set; read once.
int64_t TestWriteDelayMs() {
  static const int64_t ms = [] {
    const char* v = std::getenv("ARBITER_TEST_KV_WRITE_DELAY_MS");
    const int64_t n = v != nullptr ? std::atoll(v) : 0;
    if (n > 0) {
      spdlog::warn("ARBITER_TEST_KV_WRITE_DELAY_MS={}: every KV file write pauses half-way "
                   "(fault injection for tests)",
                   n);
    }
    return n > 0 ? n : 0;
  }();
  return ms;
}

constexpr char kMagic[8] = {'A', 'R', 'B', 'K', 'V', '0', '0', '1'};
constexpr size_t kModelHashChars = 16;
// Header field offsets.
constexpr size_t kVersionAt = 8;
constexpr size_t kDtypeAt = 12;
constexpr size_t kModelHashAt = 16;
constexpr size_t kLayersAt = 32;
constexpr size_t kKvDimAt = 36;
constexpr size_t kTokensAt = 40;
constexpr size_t kTrailerBytes = 8;

void PutU32(uint8_t* p, uint32_t v) {
  for (int i = 0; i < 4; ++i) p[i] = static_cast<uint8_t>(v >> (8 * i));
}
uint32_t GetU32(const uint8_t* p) {
  return uint32_t{p[0]} | uint32_t{p[1]} << 8 | uint32_t{p[2]} << 16 | uint32_t{p[3]} << 24;
}
uint64_t GetU64(const uint8_t* p) {
  return uint64_t{GetU32(p)} | uint64_t{GetU32(p + 4)} << 32;
}

// REQUIRES: row_bytes = KvRowBytes(type, kv_dim) ≤ 34 × 2^16 / 32 and the
// other factors within the format's bounds (no overflow).
uint64_t ExpectedBytes(uint64_t n_layers, uint64_t row_bytes, uint64_t n_tokens) {
  return kKvFileHeaderBytes + 4 * n_tokens + 2 * n_layers * n_tokens * row_bytes + kTrailerBytes;
}

// kInvalidArgument unless kv_type is a KV type that can hold rows of kv_dim.
Status CheckKvRowType(const std::string& path, GgmlType kv_type, uint32_t kv_dim) {
  if (!IsKvType(kv_type)) {
    return InvalidArgumentError(
        fmt::format("{}: {} is not a KV cache type", path, GgmlTypeName(kv_type)));
  }
  if (KvRowBytes(kv_type, kv_dim) == 0 && kv_dim != 0) {
    return InvalidArgumentError(fmt::format("{}: kv_type {} cannot hold rows of {} values", path,
                                            KvTypeName(kv_type), kv_dim));
  }
  return OkStatus();
}

}  // namespace

uint64_t KvFileBytes(const KvSnapshot& s) {
  return ExpectedBytes(s.n_layers, s.row_bytes(), s.tokens.size());
}

Status WriteKvFile(const std::string& path, const KvSnapshot& s) {
  if (s.n_layers > kKvFileMaxLayers || s.kv_dim > kKvFileMaxKvDim ||
      s.tokens.size() > kKvFileMaxTokens) {
    return InvalidArgumentError(fmt::format(
        "{}: {} layers × {} kv_dim × {} tokens is over the format's bounds", path, s.n_layers,
        s.kv_dim, s.tokens.size()));
  }
  ARBITER_RETURN_IF_ERROR(CheckKvRowType(path, s.kv_type, s.kv_dim));
  if (s.kv.size() != s.ExpectedKvBytes()) {
    return InvalidArgumentError(fmt::format("{}: {} KV bytes for {} layers × {} tokens × {} "
                                            "kv_dim of {} (expected {})",
                                            path, s.kv.size(), s.n_layers, s.tokens.size(),
                                            s.kv_dim, KvTypeName(s.kv_type),
                                            s.ExpectedKvBytes()));
  }
  return WriteKvFile(path, s.model_hash, s.Rows());
}

uint64_t KvFileBytes(const KvRowsView& rows) {
  return ExpectedBytes(rows.n_layers, rows.row_bytes(), rows.n_tokens);
}

Status WriteKvFile(const std::string& path, const std::string& model_hash,
                   const KvRowsView& s) {
  if (model_hash.size() != kModelHashChars) {
    return InvalidArgumentError(fmt::format("{}: model hash must be {} chars (got \"{}\")", path,
                                            kModelHashChars, model_hash));
  }
  if (s.n_layers > kKvFileMaxLayers || s.kv_dim > kKvFileMaxKvDim ||
      s.n_tokens > kKvFileMaxTokens) {
    return InvalidArgumentError(fmt::format(
        "{}: {} layers × {} kv_dim × {} tokens is over the format's bounds", path, s.n_layers,
        s.kv_dim, s.n_tokens));
  }
  ARBITER_RETURN_IF_ERROR(CheckKvRowType(path, s.kv_type, s.kv_dim));
  if (s.k.size() != s.n_layers || s.v.size() != s.n_layers) {
    return InvalidArgumentError(fmt::format("{}: {} K and {} V row pointers for {} layers", path,
                                            s.k.size(), s.v.size(), s.n_layers));
  }
  for (size_t i = 0; i < s.n_tokens; ++i) {
    if (s.tokens[i] < 0) {
      return InvalidArgumentError(
          fmt::format("{}: token {} has a negative id {}", path, i, s.tokens[i]));
    }
  }
  uint8_t header[kKvFileHeaderBytes] = {};
  std::memcpy(header, kMagic, sizeof(kMagic));
  PutU32(header + kVersionAt, kKvFileVersion);
  PutU32(header + kDtypeAt, static_cast<uint32_t>(s.kv_type));
  std::memcpy(header + kModelHashAt, model_hash.data(), kModelHashChars);
  PutU32(header + kLayersAt, s.n_layers);
  PutU32(header + kKvDimAt, s.kv_dim);
  PutU32(header + kTokensAt, static_cast<uint32_t>(s.n_tokens));
  const size_t layer_bytes = s.n_tokens * s.row_bytes();
  return WriteFileAtomicStreaming(path, [&](const auto& append) -> Status {
    XXH3_state_t* state = XXH3_createState();
    if (state == nullptr) return ResourceExhaustedError("out of memory for a hash state");
    XXH3_64bits_reset(state);
    auto put = [&](const void* p, size_t n) -> Status {
      if (n == 0) return OkStatus();  // an empty vector's data() may be null
      XXH3_64bits_update(state, p, n);
      return append(p, n);
    };
    // Little-endian hosts only write the arrays as they are in memory.
    static_assert(std::endian::native == std::endian::little, "KV files are little-endian");
    Status st = put(header, sizeof(header));
    if (st.ok()) st = put(s.tokens, s.n_tokens * sizeof(int32_t));
    if (const int64_t ms = TestWriteDelayMs(); ms > 0) {
      std::this_thread::sleep_for(std::chrono::milliseconds(ms));
    }
    for (uint32_t l = 0; st.ok() && l < s.n_layers; ++l) {
      st = put(s.k[l], layer_bytes);
      if (st.ok()) st = put(s.v[l], layer_bytes);
    }
    const uint64_t sum = XXH3_64bits_digest(state);
    XXH3_freeState(state);
    if (!st.ok()) return st;
    uint8_t trailer[kTrailerBytes];
    PutU32(trailer, static_cast<uint32_t>(sum));
    PutU32(trailer + 4, static_cast<uint32_t>(sum >> 32));
    return append(trailer, sizeof(trailer));
  }, /*mode=*/0600);  // conversation state: owner-only, like its directory
}

namespace {

// A file's header fields, once every check passed.
struct KvFileLayout {
  std::string model_hash;
  uint32_t n_layers = 0;
  uint32_t kv_dim = 0;
  GgmlType kv_type = GgmlType::kF32;
  uint32_t n_tokens = 0;
  size_t tokens_at = kKvFileHeaderBytes;  // offset of tokens [n_tokens] i32
  size_t kv_at = 0;                       // offset of K/V [n_layers, 2, n_tokens] rows
  size_t kv_bytes = 0;
};

// Every check of ReadKvFile over `data` (alignment-free reads: `data` may
// be any pointer, e.g. the fuzzer's).
Result<KvFileLayout> ValidateKvFile(const uint8_t* data, size_t size, const std::string& name,
                                    const std::string& expected_model_hash,
                                    std::optional<GgmlType> expected_kv_type) {
  if (size < kKvFileHeaderBytes + kTrailerBytes) {
    return DataLossError(fmt::format("{}: {} bytes is too short for a KV file (header {} + "
                                     "checksum {})",
                                     name, size, kKvFileHeaderBytes, kTrailerBytes));
  }
  if (std::memcmp(data, kMagic, sizeof(kMagic)) != 0) {
    return DataLossError(fmt::format("{}: bad magic (not an arbiter KV file)", name));
  }
  const uint32_t version = GetU32(data + kVersionAt);
  if (version != kKvFileVersion) {
    return DataLossError(
        fmt::format("{}: version {} is not supported (expected {})", name, version, kKvFileVersion));
  }
  const uint32_t dtype = GetU32(data + kDtypeAt);
  const GgmlType kv_type = static_cast<GgmlType>(dtype);
  if (!IsKvType(kv_type)) {
    return DataLossError(fmt::format("{}: dtype {} is not supported (expected a KV type: 0 f32, "
                                     "1 f16, 8 q8_0, 30 bf16)",
                                     name, dtype));
  }
  const std::string model_hash(reinterpret_cast<const char*>(data + kModelHashAt),
                               kModelHashChars);
  const uint32_t n_layers = GetU32(data + kLayersAt);
  const uint32_t kv_dim = GetU32(data + kKvDimAt);
  const uint32_t n_tokens = GetU32(data + kTokensAt);
  if (n_layers > kKvFileMaxLayers || kv_dim > kKvFileMaxKvDim || n_tokens > kKvFileMaxTokens) {
    return DataLossError(fmt::format(
        "{}: header dimensions {} layers × {} kv_dim × {} tokens are over the format's bounds",
        name, n_layers, kv_dim, n_tokens));
  }
  const size_t row_bytes = KvRowBytes(kv_type, kv_dim);
  if (row_bytes == 0 && kv_dim != 0) {
    return DataLossError(fmt::format("{}: kv_dim {} is not a multiple of {}'s block", name,
                                     kv_dim, KvTypeName(kv_type)));
  }
  const uint64_t expected = ExpectedBytes(n_layers, row_bytes, n_tokens);
  if (size != expected) {
    return DataLossError(fmt::format("{}: {} ({} bytes, expected {} for {} tokens)", name,
                                     size < expected ? "truncated" : "trailing bytes", size,
                                     expected, n_tokens));
  }
  const uint64_t stored = GetU64(data + size - kTrailerBytes);
  const uint64_t actual = XXH3_64bits(data, size - kTrailerBytes);
  if (stored != actual) {
    return DataLossError(fmt::format("{}: checksum mismatch (stored {:016x}, computed {:016x})",
                                     name, stored, actual));
  }
  if (!expected_model_hash.empty() && model_hash != expected_model_hash) {
    return FailedPreconditionError(fmt::format(
        "{}: KV of model {} is not usable by model {} (foreign file)", name, model_hash,
        expected_model_hash));
  }
  if (expected_kv_type && kv_type != *expected_kv_type) {
    return FailedPreconditionError(fmt::format(
        "{}: KV of type {} is not usable by a model whose kv_type is {} (foreign file)", name,
        KvTypeName(kv_type), KvTypeName(*expected_kv_type)));
  }
  for (uint32_t i = 0; i < n_tokens; ++i) {
    const int32_t id = static_cast<int32_t>(GetU32(data + kKvFileHeaderBytes + 4 * size_t{i}));
    if (id < 0) return DataLossError(fmt::format("{}: token {} has a negative id {}", name, i, id));
  }
  KvFileLayout l;
  l.model_hash = model_hash;
  l.n_layers = n_layers;
  l.kv_dim = kv_dim;
  l.kv_type = kv_type;
  l.n_tokens = n_tokens;
  l.kv_at = kKvFileHeaderBytes + size_t{n_tokens} * sizeof(int32_t);
  l.kv_bytes = size_t{2} * n_layers * n_tokens * row_bytes;
  return l;
}

}  // namespace

Result<KvSnapshot> ParseKvFile(const uint8_t* data, size_t size, const std::string& name,
                               const std::string& expected_model_hash,
                               std::optional<GgmlType> expected_kv_type) {
  ARBITER_ASSIGN_OR_RETURN(KvFileLayout l, ValidateKvFile(data, size, name, expected_model_hash,
                                                          expected_kv_type));
  KvSnapshot s;
  s.model_hash = std::move(l.model_hash);
  s.n_layers = l.n_layers;
  s.kv_dim = l.kv_dim;
  s.kv_type = l.kv_type;
  s.tokens.resize(l.n_tokens);
  // memcpy of 0 bytes from/to an empty vector's null data() is undefined.
  if (l.n_tokens > 0) {
    std::memcpy(s.tokens.data(), data + l.tokens_at, size_t{l.n_tokens} * sizeof(int32_t));
  }
  s.kv.resize(l.kv_bytes);  // not zeroed (KvBytes): overwritten next
  if (!s.kv.empty()) std::memcpy(s.kv.data(), data + l.kv_at, s.kv.size());
  return s;
}

Result<KvSnapshot> ReadKvFile(const std::string& path, const std::string& expected_model_hash,
                              std::optional<GgmlType> expected_kv_type) {
  // Every byte is hashed then copied: map it all at once.
  ARBITER_ASSIGN_OR_RETURN(MappedFile f, MappedFile::Open(path, /*populate=*/true));
  return ParseKvFile(f.data(), f.size(), path, expected_model_hash, expected_kv_type);
}

Result<MappedKvFile> MapKvFile(const std::string& path, const std::string& expected_model_hash,
                               std::optional<GgmlType> expected_kv_type) {
  ARBITER_ASSIGN_OR_RETURN(MappedFile f, MappedFile::Open(path, /*populate=*/true));
  ARBITER_ASSIGN_OR_RETURN(KvFileLayout l, ValidateKvFile(f.data(), f.size(), path,
                                                          expected_model_hash, expected_kv_type));
  MappedKvFile m;
  m.model_hash_ = std::move(l.model_hash);
  // The mapping is page-aligned and the format puts both arrays at
  // multiples of 4 bytes (64, 64 + 4·n_tokens), so they are read in place
  // as i32 and as rows of the KV type (little-endian hosts only, as the
  // writer).
  m.view_.n_layers = l.n_layers;
  m.view_.kv_dim = l.kv_dim;
  m.view_.kv_type = l.kv_type;
  m.view_.tokens = reinterpret_cast<const int32_t*>(f.data() + l.tokens_at);
  m.view_.n_tokens = l.n_tokens;
  m.view_.kv = f.data() + l.kv_at;
  m.view_.kv_bytes = l.kv_bytes;
  m.file_ = std::move(f);  // a moved MappedFile keeps its mapping's address
  return m;
}

}  // namespace arbiter
