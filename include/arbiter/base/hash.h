// arbiter/base/hash.h — content hashes.
//
// SHA-256 via OpenSSL libcrypto (EVP); used for content addressing (frame
// hashes, model digests). XXH3-64 via xxHash for fast non-cryptographic keys.
//
// Thread safety: free functions, thread-safe. Sha256 objects are
// thread-compatible.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

namespace arbiter {

using Sha256Digest = std::array<uint8_t, 32>;

// Incremental SHA-256 (FIPS 180-4).
class Sha256 {
 public:
  Sha256();
  ~Sha256();
  Sha256(const Sha256&) = delete;
  Sha256& operator=(const Sha256&) = delete;

  void Update(const void* data, size_t size_bytes);
  void Update(std::string_view s) { Update(s.data(), s.size()); }
  // Finishes the hash. REQUIRES: called once; no Update() afterwards.
  Sha256Digest Finish();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

Sha256Digest Sha256Of(const void* data, size_t size_bytes);
inline Sha256Digest Sha256Of(std::string_view s) { return Sha256Of(s.data(), s.size()); }

// Lower-case hex of `size_bytes` bytes.
std::string HexEncode(const void* data, size_t size_bytes);
inline std::string HexEncode(const Sha256Digest& d) { return HexEncode(d.data(), d.size()); }

// XXH3 64-bit hash.
uint64_t Xxh3_64(const void* data, size_t size_bytes, uint64_t seed = 0);

}  // namespace arbiter
