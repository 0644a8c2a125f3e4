// tools/model_maker/test_media.h — media the tests and benchmarks feed the
// vision models: a PNG of lines of text rendered with a real TrueType font.
//
// Rendered by Debian's python3 with PIL (python3-pil, installed by
// scripts/install-deps.sh) and DejaVu Sans 28 px, black on white, 8-bit
// grayscale, 900 px wide, 60 px per line.
//
// Thread safety: runs a child process; call from one thread at a time.
#pragma once

#include <string>
#include <vector>

#include "arbiter/base/status.h"

namespace arbiter {

// The two lines the modality tests read back: "Invoice 4711: total due
// 1,234.56 EUR" and "Memory budget exceeded on node alpha".
std::vector<std::string> OcrTestLines();

// Writes the lines to `path` as a PNG. Errors: kFailedPrecondition when
// python3-pil or the font is missing, kInternal when the renderer fails.
Status WriteTextPng(const std::string& path, const std::vector<std::string>& lines);

}  // namespace arbiter
