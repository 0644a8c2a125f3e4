// libFuzzer target: the image front door over arbitrary bytes —
// DecodeImageGray (magic-byte sniffing, header dimension checks, our BMP and
// EXIF readers, Leptonica's decoders) and DecodeDataUrl (the same bytes as a
// URL string). Small limits keep each input cheap.
// Invariants: no crash, no read outside the input; an accepted image
// respects the limits and its pixel buffer is exactly width × height; a
// decoded data: URL respects max_bytes.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <span>
#include <string_view>

#include "arbiter/formats/image.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  arbiter::ImageLimits limits;
  limits.max_pixels = 1 << 20;
  limits.max_side = 4096;
  limits.max_bytes = 1 << 20;
  arbiter::Result<arbiter::GrayImage> r = arbiter::DecodeImageGray(std::span(data, size), limits);
  if (r.ok()) {
    const arbiter::GrayImage& g = *r;
    if (g.width <= 0 || g.height <= 0 || g.width >= limits.max_side || g.height >= limits.max_side)
      std::abort();
    const uint64_t pixels = static_cast<uint64_t>(g.width) * static_cast<uint64_t>(g.height);
    if (pixels > limits.max_pixels || g.pixels.size() != pixels) std::abort();
  } else if (r.status().code() != arbiter::StatusCode::kInvalidArgument) {
    std::abort();
  }

  const std::string_view url(reinterpret_cast<const char*>(data), size);
  constexpr size_t kMaxUrlBytes = 4096;
  arbiter::Result<std::vector<uint8_t>> bytes =
      arbiter::DecodeDataUrl(url, "image_url", kMaxUrlBytes);
  if (bytes.ok()) {
    if (bytes->empty() || bytes->size() > kMaxUrlBytes || bytes->size() > size) std::abort();
  } else if (bytes.status().code() != arbiter::StatusCode::kInvalidArgument) {
    std::abort();
  }
  return 0;
}
