// arbiter/backends/tesseract_ocr.h — text recognition in images
// (capability "ocr") with Tesseract's LSTM engine.
//
// Input is a GrayImage from DecodeImageGray (8-bit gray, orientation
// applied). Output is the text line by line, with each line's box in the
// image's pixel coordinates (x, y = top-left; w, h in pixels) and
// Tesseract's confidence (0..100).
//
// Usage:
//   ARBITER_ASSIGN_OR_RETURN(std::unique_ptr<TesseractOcr> ocr, TesseractOcr::Load({}));
//   ARBITER_ASSIGN_OR_RETURN(OcrResult r, ocr->Recognize(image, cancel_token));
//
// Thread safety: thread-compatible — one TessBaseAPI per instance, one call
// at a time per instance; separate instances may run on separate threads.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "arbiter/base/cancel.h"
#include "arbiter/base/status.h"
#include "arbiter/formats/image.h"

namespace arbiter {

struct OcrLine {
  std::string text;                // UTF-8, no trailing newline
  float confidence = 0;            // 0..100, Tesseract's
  int x = 0, y = 0, w = 0, h = 0;  // pixels; x, y = top-left
};

struct OcrResult {
  std::string text;  // the lines' texts joined by "\n"
  std::vector<OcrLine> lines;
};

struct TesseractOptions {
  std::string language = "eng";  // "<language>.traineddata" in tessdata_dir; "eng+deu" allowed
  std::string tessdata_dir =
      "";  // "" = $TESSDATA_PREFIX, else the package's /usr/share/tesseract-ocr/5/tessdata
};

class TesseractOcr {
 public:
  // Errors: kNotFound naming the missing .traineddata path; kDataLoss when
  // Tesseract cannot initialize from it.
  static Result<std::unique_ptr<TesseractOcr>> Load(const TesseractOptions& options);
  ~TesseractOcr();
  TesseractOcr(const TesseractOcr&) = delete;
  TesseractOcr& operator=(const TesseractOcr&) = delete;

  // Recognizes `image` (REQUIRES: width, height > 0 and pixels.size() ==
  // width × height, else kInvalidArgument). Lines come from Tesseract's
  // RIL_TEXTLINE iterator in reading order; empty lines are dropped.
  // `cancelled` is checked from Tesseract's progress monitor while it
  // recognizes (kCancelled). An image without text → text "" and no lines.
  Result<OcrResult> Recognize(const GrayImage& image, const Cancellation& cancelled);

  // The .traineddata files it reads.
  std::vector<std::string> files() const;
  // Σ sizes of those files, bytes.
  static uint64_t EstimateBytes(const TesseractOptions& options);
  // The identity of the recognizer for caches keyed by model: "tesseract-<major>/<language>",
  // e.g. "tesseract-5/eng".
  std::string family() const;

  struct Impl;  // internal

 private:
  TesseractOcr() = default;
  std::unique_ptr<Impl> impl_;
};

}  // namespace arbiter
