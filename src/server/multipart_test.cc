#include "arbiter/server/multipart.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace arbiter {
namespace {

using ::testing::HasSubstr;

constexpr std::string_view kType = "multipart/form-data; boundary=XyZ";

// What the openai SDK and curl send: a field and a file whose content holds
// CRLFs and a near-boundary.
TEST(MultipartTest, ParsesFieldsAndAFileWithBinaryContent) {
  const std::string file = std::string("RIFF\0\r\n--XY\r\n--\r\n", 16) + "\xff\xfe";
  const std::string body = "--XyZ\r\nContent-Disposition: form-data; name=\"model\"\r\n\r\nasr\r\n"
                           "--XyZ\r\nContent-Disposition: form-data; name=\"file\"; "
                           "filename=\"a \\\"b\\\".wav\"\r\nContent-Type: audio/wav\r\n\r\n" +
                           file + "\r\n--XyZ--\r\n";
  Result<std::vector<FormPart>> parts = ParseMultipart(kType, body);
  ASSERT_TRUE(parts.ok()) << parts.status().message();
  ASSERT_EQ(parts->size(), 2u);
  EXPECT_EQ((*parts)[0].name, "model");
  EXPECT_EQ((*parts)[0].data, "asr");
  EXPECT_FALSE((*parts)[0].has_filename);
  const FormPart* f = FindPart(*parts, "file");
  ASSERT_NE(f, nullptr);
  EXPECT_EQ(f->filename, "a \"b\".wav");
  EXPECT_EQ(f->content_type, "audio/wav");
  EXPECT_EQ(f->data, file);
  EXPECT_EQ(FindPart(*parts, "nope"), nullptr);
}

TEST(MultipartTest, AcceptsAPreambleAQuotedBoundaryAndAnEmptyPart) {
  const std::string body = "preamble\r\n--a b\r\nContent-Disposition: form-data; name=x\r\n\r\n"
                           "\r\n--a b--";
  Result<std::vector<FormPart>> parts =
      ParseMultipart("Multipart/Form-Data; charset=utf-8; boundary=\"a b\"", body);
  ASSERT_TRUE(parts.ok()) << parts.status().message();
  ASSERT_EQ(parts->size(), 1u);
  EXPECT_EQ((*parts)[0].name, "x");
  EXPECT_EQ((*parts)[0].data, "");
}

TEST(MultipartTest, RefusesMalformedBodiesNamingTheProblem) {
  auto error = [](std::string_view type, std::string_view body) {
    Result<std::vector<FormPart>> r = ParseMultipart(type, body);
    EXPECT_FALSE(r.ok());
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
    return r.ok() ? std::string() : r.status().message();
  };
  EXPECT_THAT(error("application/json", "{}"), HasSubstr("multipart/form-data"));
  EXPECT_THAT(error("multipart/form-data", ""), HasSubstr("boundary"));
  EXPECT_THAT(error(kType, "no boundary here"), HasSubstr("no opening boundary"));
  EXPECT_THAT(error(kType, "--XyZ\r\nContent-Disposition: form-data; name=\"file\"\r\n\r\nabc"),
              HasSubstr("no closing boundary"));
  EXPECT_THAT(error(kType, "--XyZ\r\nContent-Type: text/plain\r\n\r\nabc\r\n--XyZ--"),
              HasSubstr("no Content-Disposition name"));
  EXPECT_THAT(error(kType, "--XyZ\r\nContent-Disposition: form-data; name=\"f\"\r\n"
                           "Content-Transfer-Encoding: base64\r\n\r\nabc\r\n--XyZ--"),
              HasSubstr("Content-Transfer-Encoding"));
  EXPECT_THAT(error(kType, "--XyZ\r\nContent-Disposition: form-data; name=\"f"), HasSubstr("header"));
  std::string many;
  for (size_t i = 0; i <= kMaxMultipartParts; ++i) {
    many += "--XyZ\r\nContent-Disposition: form-data; name=\"p[]\"\r\n\r\nv\r\n";
  }
  many += "--XyZ--";
  EXPECT_THAT(error(kType, many), HasSubstr("more than 64 parts"));
}

// A field has one value: `model` or `file` twice is refused, naming it;
// array fields ("name[]") repeat.
TEST(MultipartTest, AFieldSentTwiceIsRefusedUnlessItIsAnArray) {
  auto part = [](std::string_view name, std::string_view value) {
    return "--XyZ\r\nContent-Disposition: form-data; name=\"" + std::string(name) + "\"\r\n\r\n" +
           std::string(value) + "\r\n";
  };
  for (const char* name : {"model", "file"}) {
    const std::string body = part("model", "asr") + part("file", "RIFF") + part(name, "again") +
                             "--XyZ--";
    Result<std::vector<FormPart>> r = ParseMultipart(kType, body);
    ASSERT_FALSE(r.ok()) << name;
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
    EXPECT_EQ(r.status().message(),
              "multipart body: part 3: the field \"" + std::string(name) +
                  "\" is sent twice (only fields named \"...[]\" may repeat)");
  }
  const std::string arrays = part("model", "asr") + part("timestamp_granularities[]", "segment") +
                             part("timestamp_granularities[]", "word") + "--XyZ--";
  Result<std::vector<FormPart>> r = ParseMultipart(kType, arrays);
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ(r->size(), 3u);
  // A huge repeated name is quoted clipped.
  const std::string huge(5000, 'n');
  r = ParseMultipart(kType, part(huge, "1") + part(huge, "2") + "--XyZ--");
  ASSERT_FALSE(r.ok());
  EXPECT_LT(r.status().message().size(), 400u);
}

}  // namespace
}  // namespace arbiter
