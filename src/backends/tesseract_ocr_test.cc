#include "arbiter/backends/tesseract_ocr.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>

namespace arbiter {
namespace {

constexpr char kFont[] = "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf";
constexpr char kLine1[] = "Invoice 4711: total due 1,234.56 EUR";
constexpr char kLine2[] = "Memory budget exceeded on node alpha";

// Renders the two lines black on white with PIL into a PNG; empty on failure.
std::vector<uint8_t> RenderTwoLines() {
  const std::string path =
      ::testing::TempDir() + "ocr_two_lines_" + std::to_string(getpid()) + ".png";
  const std::string script =
      "from PIL import Image, ImageDraw, ImageFont\n"
      "f = ImageFont.truetype('" +
      std::string(kFont) +
      "', 28)\n"
      "im = Image.new('L', (700, 140), 255)\n"
      "d = ImageDraw.Draw(im)\n"
      "d.text((20, 20), '" +
      kLine1 +
      "', font=f, fill=0)\n"
      "d.text((20, 80), '" +
      kLine2 +
      "', font=f, fill=0)\n"
      "im.save('" +
      path + "')\n";
  const std::string cmd = "/usr/bin/python3 -c \"" + script + "\"";
  if (std::system(cmd.c_str()) != 0) return {};
  std::ifstream in(path, std::ios::binary);
  std::vector<uint8_t> bytes{std::istreambuf_iterator<char>(in), {}};
  std::filesystem::remove(path);
  return bytes;
}

TEST(TesseractOcrTest, ReadsTwoLines) {
  if (!std::filesystem::exists(kFont) || !std::filesystem::exists("/usr/bin/python3")) {
    GTEST_SKIP() << "needs " << kFont << " and python3-pil";
  }
  std::vector<uint8_t> png = RenderTwoLines();
  ASSERT_FALSE(png.empty()) << "python3 with PIL could not render the test image";
  Result<GrayImage> image = DecodeImageGray(png, ImageLimits{});
  ASSERT_TRUE(image.ok()) << image.status().ToString();

  Result<std::unique_ptr<TesseractOcr>> ocr = TesseractOcr::Load({});
  ASSERT_TRUE(ocr.ok()) << ocr.status().ToString();
  EXPECT_EQ((*ocr)->family(), "tesseract-5/eng");
  ASSERT_EQ((*ocr)->files().size(), 1u);
  Result<OcrResult> r = (*ocr)->Recognize(*image, nullptr);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  ASSERT_EQ(r->lines.size(), 2u) << r->text;
  EXPECT_EQ(r->lines[0].text, kLine1);
  EXPECT_EQ(r->lines[1].text, kLine2);
  EXPECT_EQ(r->text, std::string(kLine1) + "\n" + kLine2);
  for (const OcrLine& l : r->lines) {
    EXPECT_GT(l.confidence, 50) << l.text;
    EXPECT_LE(l.confidence, 100) << l.text;
    EXPECT_GE(l.x, 10);
    EXPECT_GT(l.w, 300);
    EXPECT_GT(l.h, 15);
    EXPECT_LT(l.h, 50);
  }
  EXPECT_NEAR(r->lines[0].y, 20, 12);
  EXPECT_NEAR(r->lines[1].y, 80, 12);

  // The same instance again gives the same answer.
  Result<OcrResult> again = (*ocr)->Recognize(*image, nullptr);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->text, r->text);

  CancelSource source;
  source.Cancel();
  EXPECT_EQ((*ocr)->Recognize(*image, source.token()).status().code(), StatusCode::kCancelled);
}

TEST(TesseractOcrTest, BlankImageAndBadInput) {
  Result<std::unique_ptr<TesseractOcr>> ocr = TesseractOcr::Load({});
  ASSERT_TRUE(ocr.ok());
  GrayImage blank{200, 100, std::vector<uint8_t>(200 * 100, 255), "png"};
  Result<OcrResult> r = (*ocr)->Recognize(blank, nullptr);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->text, "");
  EXPECT_TRUE(r->lines.empty());
  GrayImage bad{200, 100, std::vector<uint8_t>(10), "png"};
  EXPECT_EQ((*ocr)->Recognize(bad, nullptr).status().code(), StatusCode::kInvalidArgument);
}

TEST(TesseractOcrTest, MissingLanguage) {
  Result<std::unique_ptr<TesseractOcr>> ocr = TesseractOcr::Load({"xyz", ""});
  ASSERT_FALSE(ocr.ok());
  EXPECT_EQ(ocr.status().code(), StatusCode::kNotFound);
  EXPECT_NE(ocr.status().message().find("xyz.traineddata"), std::string::npos)
      << ocr.status().message();
  EXPECT_EQ(TesseractOcr::EstimateBytes({"xyz", ""}), 0u);
  EXPECT_GT(TesseractOcr::EstimateBytes({}), 1u << 20);
}

}  // namespace
}  // namespace arbiter
