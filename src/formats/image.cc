// The image front door (arbiter/formats/image.h).
//
// Order of checks, each before anything larger is allocated:
//   1. size: empty, over max_bytes;
//   2. format from the magic bytes: PNG, JPEG, WebP, BMP only (Leptonica
//      reads more, but every format is attack surface);
//   3. dimensions from the header (Leptonica's pixReadHeaderMem for PNG,
//      JPEG and WebP; our own bounds-checked read of the BMP info header,
//      because Leptonica "reads the header" of a BMP by decoding it) against
//      max_side and max_pixels;
//   4. decode (pixReadMem), gray (pixConvertTo8), and for JPEG the EXIF
//      orientation (ReadExifOrientation: walks the markers up to SOS, reads
//      IFD0's tag 0x0112; every offset is checked against the segment).
// Leptonica's own messages go nowhere (setMsgSeverity(L_SEVERITY_NONE),
// once); its failures become "<field> is corrupt: ...".
#include "arbiter/formats/image.h"

#include <leptonica/allheaders.h>

#include <cctype>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>

#include "arbiter/base/clip.h"

namespace arbiter {
namespace {

struct PixDeleter {
  void operator()(PIX* p) const { pixDestroy(&p); }
};
using PixPtr = std::unique_ptr<PIX, PixDeleter>;

void QuietLeptonica() {
  static std::once_flag once;
  std::call_once(once, [] { setMsgSeverity(L_SEVERITY_NONE); });
}

enum class Kind { kUnknown, kPng, kJpeg, kWebp, kBmp };

Kind Sniff(std::span<const uint8_t> b) {
  static constexpr uint8_t kPng[8] = {0x89, 'P', 'N', 'G', 0x0D, 0x0A, 0x1A, 0x0A};
  if (b.size() >= 8 && std::memcmp(b.data(), kPng, 8) == 0) return Kind::kPng;
  if (b.size() >= 3 && b[0] == 0xFF && b[1] == 0xD8 && b[2] == 0xFF) return Kind::kJpeg;
  if (b.size() >= 12 && std::memcmp(b.data(), "RIFF", 4) == 0 &&
      std::memcmp(b.data() + 8, "WEBP", 4) == 0) {
    return Kind::kWebp;
  }
  if (b.size() >= 2 && b[0] == 'B' && b[1] == 'M') return Kind::kBmp;
  return Kind::kUnknown;
}

const char* KindName(Kind k) {
  switch (k) {
    case Kind::kPng:
      return "png";
    case Kind::kJpeg:
      return "jpeg";
    case Kind::kWebp:
      return "webp";
    case Kind::kBmp:
      return "bmp";
    default:
      return "unknown";
  }
}

uint32_t Le32(const uint8_t* p) {
  return uint32_t{p[0]} | uint32_t{p[1]} << 8 | uint32_t{p[2]} << 16 | uint32_t{p[3]} << 24;
}
uint16_t Le16(const uint8_t* p) { return static_cast<uint16_t>(p[0] | p[1] << 8); }

// BMP: 14-byte file header, then the info header (its size first).
bool BmpDimensions(std::span<const uint8_t> b, int64_t* w, int64_t* h) {
  if (b.size() < 18) return false;
  const uint32_t info_size = Le32(b.data() + 14);
  if (info_size == 12) {  // BITMAPCOREHEADER: 16-bit sides
    if (b.size() < 22) return false;
    *w = Le16(b.data() + 18);
    *h = Le16(b.data() + 20);
    return true;
  }
  if (info_size < 40 || b.size() < 26) return false;
  *w = static_cast<int32_t>(Le32(b.data() + 18));
  const int64_t hh = static_cast<int32_t>(Le32(b.data() + 22));
  *h = hh < 0 ? -hh : hh;  // negative height: top-down rows
  return *w > 0;
}

// The EXIF orientation (1..8) of a JPEG, 1 when absent or unreadable.
int ReadExifOrientation(std::span<const uint8_t> b) {
  size_t pos = 2;  // after SOI
  while (pos + 4 <= b.size()) {
    if (b[pos] != 0xFF) return 1;
    const uint8_t marker = b[pos + 1];
    if (marker == 0xFF) {  // fill byte
      ++pos;
      continue;
    }
    if (marker == 0xDA || marker == 0xD9) return 1;  // SOS / EOI: no EXIF before the data
    if (marker == 0x01 || (marker >= 0xD0 && marker <= 0xD8)) {  // no length
      pos += 2;
      continue;
    }
    const size_t len = static_cast<size_t>(b[pos + 2]) << 8 | b[pos + 3];
    if (len < 2 || len > b.size() - pos - 2) return 1;
    const uint8_t* seg = b.data() + pos + 4;
    const size_t seg_len = len - 2;
    if (marker == 0xE1 && seg_len >= 6 && std::memcmp(seg, "Exif\0\0", 6) == 0) {
      const uint8_t* t = seg + 6;  // the TIFF header
      const size_t n = seg_len - 6;
      if (n < 8) return 1;
      bool le;
      if (t[0] == 'I' && t[1] == 'I') {
        le = true;
      } else if (t[0] == 'M' && t[1] == 'M') {
        le = false;
      } else {
        return 1;
      }
      auto u16 = [&](size_t at) -> uint32_t {
        return le ? uint32_t{t[at]} | uint32_t{t[at + 1]} << 8 : uint32_t{t[at]} << 8 | t[at + 1];
      };
      auto u32 = [&](size_t at) -> uint32_t {
        return le ? Le32(t + at)
                  : uint32_t{t[at]} << 24 | uint32_t{t[at + 1]} << 16 | uint32_t{t[at + 2]} << 8 |
                        t[at + 3];
      };
      if (u16(2) != 42) return 1;
      const size_t ifd = u32(4);
      if (ifd > n || n - ifd < 2) return 1;
      const size_t count = u16(ifd);
      for (size_t i = 0; i < count; ++i) {
        const size_t e = ifd + 2 + 12 * i;
        if (e > n || n - e < 12) return 1;
        if (u16(e) != 0x0112) continue;
        if (u16(e + 2) != 3 /* SHORT */ || u32(e + 4) < 1) return 1;
        const uint32_t v = u16(e + 8);
        return v >= 1 && v <= 8 ? static_cast<int>(v) : 1;
      }
      return 1;
    }
    pos += 2 + len;
  }
  return 1;
}

// The displayed picture of a stored one with EXIF orientation `o`.
PixPtr Orient(PixPtr pix, int o) {
  PIX* p = pix.get();
  switch (o) {
    case 2:
      return PixPtr(pixFlipLR(nullptr, p));
    case 3:
      return PixPtr(pixRotate180(nullptr, p));
    case 4:
      return PixPtr(pixFlipTB(nullptr, p));
    case 5: {  // transpose: rotate clockwise, then mirror
      PixPtr r(pixRotate90(p, 1));
      return r ? PixPtr(pixFlipLR(nullptr, r.get())) : nullptr;
    }
    case 6:
      return PixPtr(pixRotate90(p, 1));
    case 7: {  // transverse: rotate clockwise, then flip vertically
      PixPtr r(pixRotate90(p, 1));
      return r ? PixPtr(pixFlipTB(nullptr, r.get())) : nullptr;
    }
    case 8:
      return PixPtr(pixRotate90(p, -1));
    default:
      return pix;
  }
}

}  // namespace

Result<GrayImage> DecodeImageGray(std::span<const uint8_t> bytes, const ImageLimits& limits,
                                  std::string_view field) {
  QuietLeptonica();
  const std::string f(field);
  if (bytes.empty()) return InvalidArgumentError(f + " is empty");
  if (bytes.size() > limits.max_bytes) {
    return InvalidArgumentError(f + " is " + std::to_string(bytes.size()) +
                                " bytes; the limit is " + std::to_string(limits.max_bytes));
  }
  const Kind kind = Sniff(bytes);
  if (kind == Kind::kUnknown) return InvalidArgumentError(f + " is not a PNG, JPEG, WebP or BMP");

  int64_t w = 0, h = 0;
  if (kind == Kind::kBmp) {
    if (!BmpDimensions(bytes, &w, &h))
      return InvalidArgumentError(f + " is corrupt: bad BMP header");
  } else {
    l_int32 format = 0, pw = 0, ph = 0, bps = 0, spp = 0, iscmap = 0;
    if (pixReadHeaderMem(bytes.data(), bytes.size(), &format, &pw, &ph, &bps, &spp, &iscmap) != 0) {
      return InvalidArgumentError(f + " is corrupt: the " + KindName(kind) +
                                  " header cannot be read");
    }
    w = pw;
    h = ph;
  }
  if (w <= 0 || h <= 0) {
    return InvalidArgumentError(f + " is corrupt: " + std::to_string(w) + "x" + std::to_string(h) +
                                " is not a size");
  }
  const uint64_t pixels = static_cast<uint64_t>(w) * static_cast<uint64_t>(h);
  if (pixels > limits.max_pixels || w >= limits.max_side || h >= limits.max_side) {
    return InvalidArgumentError(f + " is " + std::to_string(w) + "x" + std::to_string(h) + " (" +
                                std::to_string(pixels) + " pixels); the limit is " +
                                std::to_string(limits.max_pixels) + " pixels and sides under " +
                                std::to_string(limits.max_side));
  }

  PixPtr pix(pixReadMem(bytes.data(), bytes.size()));
  if (!pix)
    return InvalidArgumentError(f + " is corrupt: the " + std::string(KindName(kind)) +
                                " data cannot be decoded");
  // The decoder must agree with the header we checked.
  if (static_cast<int64_t>(pixGetWidth(pix.get())) != w ||
      static_cast<int64_t>(pixGetHeight(pix.get())) != h) {
    return InvalidArgumentError(f + " is corrupt: the header and the data disagree on the size");
  }
  PixPtr gray(pixConvertTo8(pix.get(), 0));
  if (!gray) return InvalidArgumentError(f + " is corrupt: cannot convert to 8-bit gray");
  pix.reset();
  if (kind == Kind::kJpeg) {
    const int o = ReadExifOrientation(bytes);
    if (o != 1) {
      gray = Orient(std::move(gray), o);
      if (!gray) return InternalError(f + ": rotating by the EXIF orientation failed");
    }
  }

  GrayImage out;
  out.width = static_cast<int>(pixGetWidth(gray.get()));
  out.height = static_cast<int>(pixGetHeight(gray.get()));
  out.format = KindName(kind);
  out.pixels.resize(static_cast<size_t>(out.width) * out.height);
  const l_uint32* data = pixGetData(gray.get());
  const l_int32 wpl = pixGetWpl(gray.get());
  for (int y = 0; y < out.height; ++y) {
    const l_uint32* line = data + static_cast<size_t>(y) * wpl;
    uint8_t* row = out.pixels.data() + static_cast<size_t>(y) * out.width;
    for (int x = 0; x < out.width; ++x) row[x] = static_cast<uint8_t>(GET_DATA_BYTE(line, x));
  }
  return out;
}

namespace {

int Base64Value(char c) {
  if (c >= 'A' && c <= 'Z') return c - 'A';
  if (c >= 'a' && c <= 'z') return c - 'a' + 26;
  if (c >= '0' && c <= '9') return c - '0' + 52;
  if (c == '+' || c == '-') return 62;  // standard and URL-safe alphabets
  if (c == '/' || c == '_') return 63;
  return -1;
}

bool StartsWithNoCase(std::string_view s, std::string_view prefix) {
  if (s.size() < prefix.size()) return false;
  for (size_t i = 0; i < prefix.size(); ++i) {
    if (std::tolower(static_cast<unsigned char>(s[i])) != prefix[i]) return false;
  }
  return true;
}

// The format a data: URL's media type declares: kUnknown for a type that
// is not one DecodeImageGray reads.
Kind KindOfMediaType(std::string_view type) {
  std::string t(type);
  for (char& c : t) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  if (t == "image/png") return Kind::kPng;
  if (t == "image/jpeg" || t == "image/jpg") return Kind::kJpeg;
  if (t == "image/webp") return Kind::kWebp;
  if (t == "image/bmp" || t == "image/x-ms-bmp") return Kind::kBmp;
  return Kind::kUnknown;
}

// How an error names a format the bytes are in.
std::string FormatOf(Kind k) {
  return k == Kind::kUnknown ? "no image format arbiter reads"
                             : std::string("a ") + KindName(k) + " image";
}

}  // namespace

Result<std::vector<uint8_t>> DecodeDataUrl(std::string_view url, std::string_view field,
                                           size_t max_bytes) {
  const std::string f(field);
  if (StartsWithNoCase(url, "http://") || StartsWithNoCase(url, "https://")) {
    return InvalidArgumentError(
        f + ": remote URLs are not fetched (no outbound requests); send the image as a data: URL");
  }
  if (!StartsWithNoCase(url, "data:")) {
    return InvalidArgumentError(f + " is not a data: URL (data:<mime>;base64,<payload>)");
  }
  const size_t comma = url.find(',');
  if (comma == std::string_view::npos) {
    return InvalidArgumentError(f + " is not a data: URL: no ',' before the payload");
  }
  const std::string_view meta = url.substr(5, comma - 5);
  constexpr std::string_view kB64 = ";base64";
  if (meta.size() < kB64.size() ||
      !StartsWithNoCase(meta.substr(meta.size() - kB64.size()), kB64)) {
    return InvalidArgumentError(
        f + ": only base64 data: URLs are accepted (data:<mime>;base64,<payload>)");
  }
  // The media type (RFC 2397: before the first ';'): none, or an image type
  // we decode, which the bytes must then be.
  std::string_view media_type = meta.substr(0, meta.find(';'));
  while (!media_type.empty() && media_type.back() == ' ') media_type.remove_suffix(1);
  const Kind declared = media_type.empty() ? Kind::kUnknown : KindOfMediaType(media_type);
  if (!media_type.empty() && declared == Kind::kUnknown) {
    return InvalidArgumentError(
        f + ": the media type \"" + ClipInput(media_type) +
        "\" is not an image type arbiter decodes (image/png, image/jpeg, image/webp, image/bmp)");
  }
  std::string_view payload = url.substr(comma + 1);
  while (!payload.empty() && payload.back() == '=') payload.remove_suffix(1);
  if (url.size() - comma - 1 - payload.size() > 2 || payload.size() % 4 == 1) {
    return InvalidArgumentError(f + ": the base64 payload has a bad length or padding");
  }
  const size_t out_size =
      payload.size() / 4 * 3 + (payload.size() % 4 == 0 ? 0 : payload.size() % 4 - 1);
  if (out_size > max_bytes) {
    return InvalidArgumentError(f + " is " + std::to_string(out_size) + " bytes; the limit is " +
                                std::to_string(max_bytes));
  }
  if (out_size == 0) return InvalidArgumentError(f + " is empty");
  std::vector<uint8_t> out;
  out.reserve(out_size);
  uint32_t acc = 0;
  int bits = 0;
  for (size_t i = 0; i < payload.size(); ++i) {
    const int v = Base64Value(payload[i]);
    if (v < 0) {
      return InvalidArgumentError(f + ": the base64 payload has an invalid character at offset " +
                                  std::to_string(i));
    }
    acc = (acc << 6) | static_cast<uint32_t>(v);
    bits += 6;
    if (bits >= 8) {
      bits -= 8;
      out.push_back(static_cast<uint8_t>(acc >> bits));
      acc &= (1u << bits) - 1;
    }
  }
  if (declared != Kind::kUnknown && Sniff(out) != declared) {
    return InvalidArgumentError(f + " is declared " + std::string(media_type) +
                                " but its bytes are " + FormatOf(Sniff(out)));
  }
  return out;
}

}  // namespace arbiter
