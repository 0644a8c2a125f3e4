// See test_media.h.
#include "tools/model_maker/test_media.h"

#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>

namespace arbiter {

namespace {
constexpr const char* kFont = "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf";
constexpr const char* kPython = "/usr/bin/python3";
// argv: out path, then the lines.
constexpr const char* kRender =
    "import sys\n"
    "from PIL import Image, ImageDraw, ImageFont\n"
    "f = ImageFont.truetype(sys.argv[1], 28)\n"
    "lines = sys.argv[3:]\n"
    "im = Image.new('L', (900, 40 + 60 * len(lines)), 255)\n"
    "d = ImageDraw.Draw(im)\n"
    "for i, t in enumerate(lines): d.text((20, 20 + 60 * i), t, font=f, fill=0)\n"
    "im.save(sys.argv[2])\n";
}  // namespace

std::vector<std::string> OcrTestLines() {
  return {"Invoice 4711: total due 1,234.56 EUR", "Memory budget exceeded on node alpha"};
}

Status WriteTextPng(const std::string& path, const std::vector<std::string>& lines) {
  if (!std::filesystem::exists(kFont) || !std::filesystem::exists(kPython)) {
    return FailedPreconditionError(std::string("rendering a test image needs ") + kPython +
                                   " with PIL and " + kFont + " (scripts/install-deps.sh)");
  }
  std::vector<std::string> args = {kPython, "-c", kRender, kFont, path};
  args.insert(args.end(), lines.begin(), lines.end());
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  const pid_t pid = fork();
  if (pid < 0) return InternalError("fork failed");
  if (pid == 0) {
    execv(kPython, argv.data());
    _exit(127);
  }
  int status = 0;
  waitpid(pid, &status, 0);
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0 || !std::filesystem::exists(path)) {
    return FailedPreconditionError("rendering " + path + " failed (is python3-pil installed?)");
  }
  return OkStatus();
}

}  // namespace arbiter
