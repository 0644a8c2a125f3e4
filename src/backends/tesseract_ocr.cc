// Tesseract OCR (arbiter/backends/tesseract_ocr.h).
//
// One TessBaseAPI per instance, initialized with the LSTM engine only. A
// Recognize call copies the gray image into a Leptonica PIX (Tesseract's
// input type), runs Recognize with an ETEXT_DESC monitor whose cancel hook
// polls the caller's Cancellation, then walks the result at text-line level.
// Tesseract's debug output goes to /dev/null (debug_file).
#include "arbiter/backends/tesseract_ocr.h"

#include <leptonica/allheaders.h>
#include <tesseract/baseapi.h>
#include <tesseract/ocrclass.h>

#include <cstdlib>
#include <filesystem>
#include <sstream>

#include "arbiter/backends/backend_files.h"

namespace arbiter {

struct TesseractOcr::Impl {
  tesseract::TessBaseAPI api;
  std::vector<std::string> files;
  std::string family;
  ~Impl() { api.End(); }
};

namespace {

constexpr char kPackageTessdata[] = "/usr/share/tesseract-ocr/5/tessdata";

std::string TessdataDir(const TesseractOptions& o) {
  if (!o.tessdata_dir.empty()) return o.tessdata_dir;
  const char* env = std::getenv("TESSDATA_PREFIX");
  if (env != nullptr && *env != '\0') return env;
  return kPackageTessdata;
}

// "eng+deu" → [<dir>/eng.traineddata, <dir>/deu.traineddata].
std::vector<std::string> TraineddataFiles(const TesseractOptions& o) {
  std::vector<std::string> files;
  std::stringstream ss(o.language);
  std::string lang;
  while (std::getline(ss, lang, '+')) {
    if (!lang.empty())
      files.push_back((std::filesystem::path(TessdataDir(o)) / (lang + ".traineddata")).string());
  }
  return files;
}

bool CancelHook(void* cancel_this, int /*words*/) {
  return static_cast<const Cancellation*>(cancel_this)->cancelled();
}

struct PixDeleter {
  void operator()(PIX* p) const { pixDestroy(&p); }
};

}  // namespace

Result<std::unique_ptr<TesseractOcr>> TesseractOcr::Load(const TesseractOptions& options) {
  std::vector<std::string> files = TraineddataFiles(options);
  if (files.empty()) return InvalidArgumentError("tesseract language is empty");
  for (const std::string& f : files) {
    std::error_code ec;
    if (!std::filesystem::is_regular_file(f, ec)) {
      return NotFoundError("tesseract language data " + f +
                           " does not exist (install tesseract-ocr-<lang> or set tessdata_dir)");
    }
  }
  std::unique_ptr<TesseractOcr> ocr(new TesseractOcr());
  ocr->impl_ = std::make_unique<Impl>();
  tesseract::TessBaseAPI& api = ocr->impl_->api;
  api.SetVariable("debug_file", "/dev/null");
  if (api.Init(TessdataDir(options).c_str(), options.language.c_str(), tesseract::OEM_LSTM_ONLY) !=
      0) {
    return DataLossError("tesseract could not load " + files[0] +
                         " (corrupt, or not an LSTM model)");
  }
  api.SetPageSegMode(tesseract::PSM_AUTO);
  ocr->impl_->files = std::move(files);
  const std::string version = tesseract::TessBaseAPI::Version();
  ocr->impl_->family = "tesseract-" + version.substr(0, version.find('.')) + "/" + options.language;
  return ocr;
}

TesseractOcr::~TesseractOcr() = default;

Result<OcrResult> TesseractOcr::Recognize(const GrayImage& image, const Cancellation& cancelled) {
  if (image.width <= 0 || image.height <= 0 ||
      image.pixels.size() != static_cast<size_t>(image.width) * static_cast<size_t>(image.height)) {
    return InvalidArgumentError("image is " + std::to_string(image.width) + "x" +
                                std::to_string(image.height) + " with " +
                                std::to_string(image.pixels.size()) + " pixels; they must agree");
  }
  if (cancelled.cancelled()) return CancelledError("text recognition cancelled");
  std::unique_ptr<PIX, PixDeleter> pix(pixCreate(image.width, image.height, 8));
  if (!pix)
    return ResourceExhaustedError("cannot allocate a " + std::to_string(image.width) + "x" +
                                  std::to_string(image.height) + " image for tesseract");
  l_uint32* data = pixGetData(pix.get());
  const l_int32 wpl = pixGetWpl(pix.get());
  for (int y = 0; y < image.height; ++y) {
    l_uint32* line = data + static_cast<size_t>(y) * wpl;
    const uint8_t* row = image.pixels.data() + static_cast<size_t>(y) * image.width;
    for (int x = 0; x < image.width; ++x) SET_DATA_BYTE(line, x, row[x]);
  }

  tesseract::TessBaseAPI& api = impl_->api;
  api.SetImage(pix.get());
  api.SetSourceResolution(300);
  tesseract::ETEXT_DESC monitor;
  monitor.cancel = CancelHook;
  monitor.cancel_this = const_cast<Cancellation*>(&cancelled);
  const int rc = api.Recognize(&monitor);
  if (cancelled.cancelled()) {
    api.Clear();
    return CancelledError("text recognition cancelled");
  }
  if (rc != 0) {
    api.Clear();
    return InternalError("tesseract failed to recognize the image");
  }

  OcrResult out;
  std::unique_ptr<tesseract::ResultIterator> it(api.GetIterator());
  if (it) {
    do {
      std::unique_ptr<char[]> text(it->GetUTF8Text(tesseract::RIL_TEXTLINE));
      if (!text) continue;
      std::string t(text.get());
      while (!t.empty() && (t.back() == '\n' || t.back() == ' ')) t.pop_back();
      if (t.empty()) continue;
      OcrLine line;
      line.text = std::move(t);
      line.confidence = it->Confidence(tesseract::RIL_TEXTLINE);
      int l = 0, top = 0, r = 0, b = 0;
      if (it->BoundingBox(tesseract::RIL_TEXTLINE, &l, &top, &r, &b)) {
        line.x = l;
        line.y = top;
        line.w = r - l;
        line.h = b - top;
      }
      if (!out.text.empty()) out.text += '\n';
      out.text += line.text;
      out.lines.push_back(std::move(line));
    } while (it->Next(tesseract::RIL_TEXTLINE));
  }
  api.Clear();
  return out;
}

std::vector<std::string> TesseractOcr::files() const { return impl_->files; }

uint64_t TesseractOcr::EstimateBytes(const TesseractOptions& options) {
  return FilesBytes(TraineddataFiles(options));
}

std::string TesseractOcr::family() const { return impl_->family; }

}  // namespace arbiter
