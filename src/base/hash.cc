#include "arbiter/base/hash.h"

#include <openssl/evp.h>
#include <xxhash.h>

#include <cstdlib>

namespace arbiter {

struct Sha256::Impl {
  EVP_MD_CTX* ctx = nullptr;
};

Sha256::Sha256() : impl_(std::make_unique<Impl>()) {
  impl_->ctx = EVP_MD_CTX_new();
  if (impl_->ctx == nullptr || EVP_DigestInit_ex(impl_->ctx, EVP_sha256(), nullptr) != 1) {
    std::abort();  // libcrypto out of memory: nothing sensible to return
  }
}

Sha256::~Sha256() { EVP_MD_CTX_free(impl_->ctx); }

void Sha256::Update(const void* data, size_t size_bytes) {
  if (size_bytes > 0) EVP_DigestUpdate(impl_->ctx, data, size_bytes);
}

Sha256Digest Sha256::Finish() {
  Sha256Digest out{};
  unsigned int n = 0;
  EVP_DigestFinal_ex(impl_->ctx, out.data(), &n);
  return out;
}

Sha256Digest Sha256Of(const void* data, size_t size_bytes) {
  Sha256 h;
  h.Update(data, size_bytes);
  return h.Finish();
}

std::string HexEncode(const void* data, size_t size_bytes) {
  static constexpr char kHex[] = "0123456789abcdef";
  const auto* p = static_cast<const uint8_t*>(data);
  std::string s(size_bytes * 2, '0');
  for (size_t i = 0; i < size_bytes; ++i) {
    s[2 * i] = kHex[p[i] >> 4];
    s[2 * i + 1] = kHex[p[i] & 15];
  }
  return s;
}

uint64_t Xxh3_64(const void* data, size_t size_bytes, uint64_t seed) {
  return XXH3_64bits_withSeed(data, size_bytes, seed);
}

}  // namespace arbiter
