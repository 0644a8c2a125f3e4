// arbiter/formats/image.h — the image front door: uploaded pictures decoded
// to the 8-bit grayscale that the vision models (OCR) take, and data: URLs.
//
// DecodeImageGray is a reader of bytes from outside. Before Leptonica
// decodes anything it identifies the format from the magic bytes (only PNG,
// JPEG, WebP and BMP are accepted) and reads the dimensions from the header,
// refusing images over the pixel or side limits — so a decompression bomb
// never allocates its claimed size. JPEG EXIF orientation is applied, so the
// same picture as PNG, BMP, lossless WebP or an EXIF-rotated JPEG comes out
// with the same dimensions (and, for the lossless formats, the same pixels).
//
// Usage:
//   ARBITER_ASSIGN_OR_RETURN(std::vector<uint8_t> bytes, DecodeDataUrl(url, "image_url",
//   limits.max_bytes)); ARBITER_ASSIGN_OR_RETURN(GrayImage img, DecodeImageGray(bytes, limits,
//   "image_url"));
//
// Thread safety: the functions are thread-safe (Leptonica's message
// severity is set once, process-wide, to "none").
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "arbiter/base/status.h"

namespace arbiter {

struct ImageLimits {
  uint64_t max_pixels = 50'000'000;  // width × height
  int max_side = 20000;              // exclusive: a side of max_side or more is refused
  size_t max_bytes = 32u << 20;      // size of the encoded file, bytes
};

// An image normalized for vision models: 8-bit grayscale, EXIF orientation
// applied (JPEG), row-major, no padding.
struct GrayImage {
  int width = 0;
  int height = 0;
  std::vector<uint8_t> pixels;  // [height, width], 0 = black, 255 = white
  std::string format;           // "png" | "jpeg" | "webp" | "bmp"
};

// Decodes PNG, JPEG, WebP or BMP to 8-bit gray (Leptonica pixConvertTo8:
// RGB → luminance, colormaps → gray), applying the JPEG EXIF orientation
// (tags 1–8). Errors, kInvalidArgument, each message starting with `field`:
//   "<field> is empty", "<field> is N bytes; the limit is M",
//   "<field> is not a PNG, JPEG, WebP or BMP",
//   "<field> is 20000x20000 (400000000 pixels); the limit is 50000000 pixels
//    and sides under 20000",
//   "<field> is corrupt: <what>".
Result<GrayImage> DecodeImageGray(std::span<const uint8_t> bytes, const ImageLimits& limits,
                                  std::string_view field = "image");

// Decodes a `data:<mime>;base64,<payload>` URL of an image into its bytes
// (strict base64, '=' padding optional, no whitespace). <mime> is empty
// (`data:;base64,...`: the bytes say what they are) or the type of a format
// DecodeImageGray reads — image/png, image/jpeg (image/jpg), image/webp,
// image/bmp (image/x-ms-bmp), any case — and the bytes' magic must be that
// format. Errors, kInvalidArgument naming `field`:
//   http:// and https:// URLs: "<field>: remote URLs are not fetched (no
//     outbound requests); send the image as a data: URL";
//   other schemes, data: URLs without ";base64", bad base64;
//   another media type: "<field>: the media type \"text/plain\" is not an
//     image type arbiter decodes (...)";
//   bytes of another format: "<field> is declared image/jpeg but its bytes
//     are a png image";
//   a payload decoding to more than `max_bytes` bytes (checked before decoding).
Result<std::vector<uint8_t>> DecodeDataUrl(std::string_view url, std::string_view field,
                                           size_t max_bytes);

}  // namespace arbiter
