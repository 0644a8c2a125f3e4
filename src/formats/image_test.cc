#include "arbiter/formats/image.h"

#include <gtest/gtest.h>
#include <leptonica/allheaders.h>

#include <cstring>
#include <string>
#include <vector>

namespace arbiter {
namespace {

// A 120x80 gray picture: a light background with three rectangles.
PIX* TestPicture() {
  PIX* pix = pixCreate(120, 80, 8);
  pixSetAllArbitrary(pix, 220);
  BOX* a = boxCreate(10, 10, 40, 20);
  BOX* b = boxCreate(60, 30, 50, 40);
  BOX* c = boxCreate(5, 50, 20, 25);
  pixSetInRectArbitrary(pix, a, 0);
  pixSetInRectArbitrary(pix, b, 90);
  pixSetInRectArbitrary(pix, c, 160);
  boxDestroy(&a);
  boxDestroy(&b);
  boxDestroy(&c);
  return pix;
}

std::vector<uint8_t> Take(l_uint8* data, size_t size) {
  std::vector<uint8_t> v(data, data + size);
  lept_free(data);
  return v;
}

std::vector<uint8_t> Write(PIX* pix, int format) {
  l_uint8* data = nullptr;
  size_t size = 0;
  EXPECT_EQ(pixWriteMem(&data, &size, pix, format), 0);
  return Take(data, size);
}

std::vector<uint8_t> WebpLossless(PIX* pix) {
  l_uint8* data = nullptr;
  size_t size = 0;
  EXPECT_EQ(pixWriteMemWebP(&data, &size, pix, 100, 1), 0);
  return Take(data, size);
}

std::vector<uint8_t> Jpeg(PIX* pix) {
  l_uint8* data = nullptr;
  size_t size = 0;
  EXPECT_EQ(pixWriteMemJpeg(&data, &size, pix, 95, 0), 0);
  return Take(data, size);
}

TEST(DecodeImageGrayTest, SamePixelsFromPngBmpWebp) {
  PIX* pix = TestPicture();
  std::vector<uint8_t> png = Write(pix, IFF_PNG);
  std::vector<uint8_t> bmp = Write(pix, IFF_BMP);
  std::vector<uint8_t> webp = WebpLossless(pix);
  Result<GrayImage> a = DecodeImageGray(png, ImageLimits{});
  Result<GrayImage> b = DecodeImageGray(bmp, ImageLimits{});
  Result<GrayImage> c = DecodeImageGray(webp, ImageLimits{});
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  ASSERT_TRUE(b.ok()) << b.status().ToString();
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(a->format, "png");
  EXPECT_EQ(b->format, "bmp");
  EXPECT_EQ(c->format, "webp");
  EXPECT_EQ(a->width, 120);
  EXPECT_EQ(a->height, 80);
  ASSERT_EQ(a->pixels.size(), 120u * 80u);
  EXPECT_EQ(a->pixels[0], 220);
  EXPECT_EQ(a->pixels[15 * 120 + 20], 0);    // rectangle a
  EXPECT_EQ(a->pixels[40 * 120 + 70], 90);   // rectangle b
  EXPECT_EQ(a->pixels[60 * 120 + 10], 160);  // rectangle c
  EXPECT_EQ(a->pixels, b->pixels);
  EXPECT_EQ(a->pixels, c->pixels);
  EXPECT_EQ(b->width, 120);
  EXPECT_EQ(c->height, 80);
  pixDestroy(&pix);
}

// Inserts an APP1 Exif segment (big-endian TIFF, IFD0 with one SHORT
// Orientation entry) after the SOI of `jpeg`.
std::vector<uint8_t> WithExifOrientation(const std::vector<uint8_t>& jpeg, uint16_t orientation) {
  // clang-format off
  const uint8_t app1[] = {
      0xFF, 0xE1, 0x00, 34, 'E', 'x', 'i', 'f', 0, 0,
      'M', 'M', 0x00, 0x2A, 0, 0, 0, 8,                   // TIFF header, IFD0 at 8
      0x00, 0x01,                                         // one entry
      0x01, 0x12, 0x00, 0x03, 0, 0, 0, 1,                 // Orientation, SHORT, count 1
      static_cast<uint8_t>(orientation >> 8), static_cast<uint8_t>(orientation), 0, 0,
      0, 0, 0, 0};                                        // no next IFD
  // clang-format on
  std::vector<uint8_t> out(jpeg.begin(), jpeg.begin() + 2);
  out.insert(out.end(), std::begin(app1), std::end(app1));
  out.insert(out.end(), jpeg.begin() + 2, jpeg.end());
  return out;
}

TEST(DecodeImageGrayTest, JpegExifOrientation) {
  PIX* pix = TestPicture();
  std::vector<uint8_t> jpeg = Jpeg(pix);
  Result<GrayImage> plain = DecodeImageGray(jpeg, ImageLimits{});
  ASSERT_TRUE(plain.ok()) << plain.status().ToString();
  EXPECT_EQ(plain->format, "jpeg");
  EXPECT_EQ(plain->width, 120);
  EXPECT_EQ(plain->height, 80);

  Result<GrayImage> r6 = DecodeImageGray(WithExifOrientation(jpeg, 6), ImageLimits{});
  ASSERT_TRUE(r6.ok()) << r6.status().ToString();
  EXPECT_EQ(r6->width, 80);
  EXPECT_EQ(r6->height, 120);
  // Rotated clockwise: stored (x, y) shows at (H-1-y, x). The black
  // rectangle a (x 10..49, y 10..29) lands at x 50..69, y 10..49.
  EXPECT_LT(r6->pixels[20 * 80 + 60], 30);
  EXPECT_GT(r6->pixels[115 * 80 + 5], 190);        // stored (115, 74): background
  EXPECT_NEAR(r6->pixels[20 * 80 + 20], 160, 30);  // stored (20, 59): rectangle c

  Result<GrayImage> r3 = DecodeImageGray(WithExifOrientation(jpeg, 3), ImageLimits{});
  ASSERT_TRUE(r3.ok());
  EXPECT_EQ(r3->width, 120);
  // Rotated 180: rectangle a is at x 70..109, y 50..69.
  EXPECT_LT(r3->pixels[60 * 120 + 90], 30);

  Result<GrayImage> r8 = DecodeImageGray(WithExifOrientation(jpeg, 8), ImageLimits{});
  ASSERT_TRUE(r8.ok());
  EXPECT_EQ(r8->width, 80);
  EXPECT_EQ(r8->height, 120);
  pixDestroy(&pix);
}

uint32_t Crc32(const uint8_t* p, size_t n) {
  uint32_t c = 0xFFFFFFFFu;
  for (size_t i = 0; i < n; ++i) {
    c ^= p[i];
    for (int k = 0; k < 8; ++k) c = (c >> 1) ^ (0xEDB88320u & (0u - (c & 1u)));
  }
  return ~c;
}

void PutBe32(std::vector<uint8_t>& b, uint32_t v) {
  for (int i = 3; i >= 0; --i) b.push_back(static_cast<uint8_t>(v >> (8 * i)));
}

// A PNG signature and a valid IHDR (8-bit gray) claiming w x h, then IEND.
std::vector<uint8_t> PngHeader(uint32_t w, uint32_t h) {
  std::vector<uint8_t> b = {0x89, 'P', 'N', 'G', 0x0D, 0x0A, 0x1A, 0x0A};
  PutBe32(b, 13);
  const size_t type_at = b.size();
  b.insert(b.end(), {'I', 'H', 'D', 'R'});
  PutBe32(b, w);
  PutBe32(b, h);
  b.insert(b.end(), {8, 0, 0, 0, 0});
  PutBe32(b, Crc32(b.data() + type_at, b.size() - type_at));
  PutBe32(b, 0);
  b.insert(b.end(), {'I', 'E', 'N', 'D'});
  PutBe32(b, Crc32(reinterpret_cast<const uint8_t*>("IEND"), 4));
  return b;
}

TEST(DecodeImageGrayTest, RefusesBombFromTheHeader) {
  Result<GrayImage> r = DecodeImageGray(PngHeader(20000, 20000), ImageLimits{});
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(r.status().message().rfind(
                "image is 20000x20000 (400000000 pixels); the limit is 50000000", 0),
            0u)
      << r.status().message();
  // A side at the bound is refused even under the pixel limit.
  r = DecodeImageGray(PngHeader(20000, 10), ImageLimits{});
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().message().rfind("image is 20000x10 (200000 pixels)", 0), 0u)
      << r.status().message();
  // Within the limits the header passes and the missing data is "corrupt".
  r = DecodeImageGray(PngHeader(100, 100), ImageLimits{});
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().message().rfind("image is corrupt: ", 0), 0u) << r.status().message();

  PIX* pix = TestPicture();
  std::vector<uint8_t> bmp = Write(pix, IFF_BMP);
  ImageLimits small;
  small.max_pixels = 1000;
  r = DecodeImageGray(bmp, small, "image_url");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().message().rfind("image_url is 120x80 (9600 pixels); the limit is 1000", 0),
            0u)
      << r.status().message();
  pixDestroy(&pix);
}

TEST(DecodeImageGrayTest, RefusesEmptyUnknownTruncated) {
  Result<GrayImage> r = DecodeImageGray({}, ImageLimits{});
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().message(), "image is empty");
  const std::string gif = "GIF89a\x01\x00\x01\x00";
  r = DecodeImageGray(std::span(reinterpret_cast<const uint8_t*>(gif.data()), gif.size()),
                      ImageLimits{});
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().message(), "image is not a PNG, JPEG, WebP or BMP");

  PIX* pix = TestPicture();
  for (int format : {IFF_PNG, IFF_BMP}) {
    std::vector<uint8_t> b = Write(pix, format);
    for (size_t cut : {size_t{10}, size_t{30}, b.size() / 2, b.size() - 1}) {
      std::vector<uint8_t> t(b.begin(), b.begin() + static_cast<std::ptrdiff_t>(cut));
      Result<GrayImage> g = DecodeImageGray(t, ImageLimits{});
      // A truncated file is refused or (BMP/PNG readers that tolerate a short
      // tail) decoded at the header's size; never anything else.
      if (g.ok()) {
        EXPECT_EQ(g->width, 120);
        EXPECT_EQ(g->pixels.size(), 120u * 80u);
      } else {
        EXPECT_EQ(g.status().code(), StatusCode::kInvalidArgument);
      }
    }
  }
  pixDestroy(&pix);
}

TEST(DecodeDataUrlTest, GoodAndBad) {
  // Without a media type the bytes are not checked here (DecodeImageGray
  // sniffs them).
  Result<std::vector<uint8_t>> r = DecodeDataUrl("data:;base64,aGVsbG8=", "image_url", 100);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(std::string(r->begin(), r->end()), "hello");
  r = DecodeDataUrl("data:;base64,aGVsbG8", "image_url", 100);  // no padding
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(std::string(r->begin(), r->end()), "hello");
  r = DecodeDataUrl("data:;base64,AAEC/w==", "x", 100);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(*r, (std::vector<uint8_t>{0, 1, 2, 255}));

  r = DecodeDataUrl("https://example.com/cat.png", "image_url", 100);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(r.status().message(),
            "image_url: remote URLs are not fetched (no outbound requests); send the image as a "
            "data: URL");
  r = DecodeDataUrl("HTTP://example.com/cat.png", "image_url", 100);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().message().rfind("image_url: remote URLs", 0), 0u);

  for (const char* bad : {"data:image/png;base64,aGV$bG8=", "data:image/png;base64,a",
                          "data:image/png,hello", "file:///etc/passwd", "data:image/png;base64",
                          "data:image/png;base64,aGVsbG8====", "data:image/png;base64,"}) {
    r = DecodeDataUrl(bad, "image_url", 100);
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument) << bad;
    EXPECT_EQ(r.status().message().rfind("image_url", 0), 0u) << r.status().message();
  }
  r = DecodeDataUrl("data:image/png;base64,aGVsbG8gd29ybGQ=", "image_url", 5);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().message(), "image_url is 11 bytes; the limit is 5");
}

// Base64 of `bytes`, for data: URLs.
std::string Base64(const std::vector<uint8_t>& bytes) {
  static constexpr char kAlphabet[] =
      "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string out;
  for (size_t i = 0; i < bytes.size(); i += 3) {
    const uint32_t n = uint32_t{bytes[i]} << 16 |
                       (i + 1 < bytes.size() ? uint32_t{bytes[i + 1]} << 8 : 0) |
                       (i + 2 < bytes.size() ? uint32_t{bytes[i + 2]} : 0);
    out += kAlphabet[n >> 18 & 63];
    out += kAlphabet[n >> 12 & 63];
    out += i + 1 < bytes.size() ? kAlphabet[n >> 6 & 63] : '=';
    out += i + 2 < bytes.size() ? kAlphabet[n & 63] : '=';
  }
  return out;
}

TEST(DecodeDataUrlTest, TheMediaTypeMustBeAnImageTypeThatTheBytesAre) {
  PIX* pix = TestPicture();
  const std::vector<uint8_t> png = Write(pix, IFF_PNG);
  const std::vector<uint8_t> jpeg = Jpeg(pix);
  pixDestroy(&pix);
  const std::string png64 = Base64(png);
  for (const char* type : {"image/png", "IMAGE/PNG", "image/png;name=a.png", ""}) {
    Result<std::vector<uint8_t>> r =
        DecodeDataUrl(std::string("data:") + type + ";base64," + png64, "image_url", 1 << 20);
    ASSERT_TRUE(r.ok()) << type << ": " << r.status().ToString();
    EXPECT_EQ(*r, png);
  }
  Result<std::vector<uint8_t>> r =
      DecodeDataUrl("data:image/jpg;base64," + Base64(jpeg), "image_url", 1 << 20);
  ASSERT_TRUE(r.ok()) << r.status().ToString();

  // PNG bytes declared as text: the media type is named.
  r = DecodeDataUrl("data:text/plain;base64," + png64, "messages[0].content[1].image_url", 1 << 20);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(r.status().message(),
            "messages[0].content[1].image_url: the media type \"text/plain\" is not an image "
            "type arbiter decodes (image/png, image/jpeg, image/webp, image/bmp)");
  for (const char* type : {"image/gif", "image/svg+xml", "application/octet-stream"}) {
    r = DecodeDataUrl(std::string("data:") + type + ";base64," + png64, "image", 1 << 20);
    ASSERT_FALSE(r.ok()) << type;
    EXPECT_NE(r.status().message().find(type), std::string::npos) << r.status().message();
  }
  // An image type the bytes are not.
  r = DecodeDataUrl("data:image/jpeg;base64," + png64, "image", 1 << 20);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().message(), "image is declared image/jpeg but its bytes are a png image");
  r = DecodeDataUrl("data:image/png;base64,aGVsbG8=", "image", 100);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().message(),
            "image is declared image/png but its bytes are no image format arbiter reads");
  // A huge media type is quoted clipped.
  r = DecodeDataUrl("data:" + std::string(10000, 't') + ";base64," + png64, "image", 1 << 20);
  ASSERT_FALSE(r.ok());
  EXPECT_LT(r.status().message().size(), 400u);
}

}  // namespace
}  // namespace arbiter
