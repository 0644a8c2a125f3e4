#include "arbiter/backends/backend_files.h"

#include <filesystem>
#include <system_error>

namespace arbiter {

uint64_t FilesBytes(const std::vector<std::string>& paths) {
  namespace fs = std::filesystem;
  uint64_t total = 0;
  for (const std::string& p : paths) {
    std::error_code ec;
    if (fs::is_directory(p, ec)) {
      for (auto it = fs::recursive_directory_iterator(p, ec);
           !ec && it != fs::recursive_directory_iterator(); it.increment(ec)) {
        std::error_code fec;
        if (it->is_regular_file(fec)) total += it->file_size(fec);
      }
    } else if (fs::is_regular_file(p, ec)) {
      const uintmax_t size = fs::file_size(p, ec);
      if (!ec) total += size;
    }
  }
  return total;
}

}  // namespace arbiter
