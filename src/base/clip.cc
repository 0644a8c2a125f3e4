// See arbiter/base/clip.h.
#include "arbiter/base/clip.h"

namespace arbiter {

std::string ClipInput(std::string_view text, size_t max_bytes) {
  if (text.size() <= max_bytes) return std::string(text);
  size_t end = max_bytes;
  // Back up over continuation bytes (10xxxxxx) to the start of the
  // character that would be cut; it is dropped whole.
  while (end > 0 && (static_cast<unsigned char>(text[end]) & 0xC0) == 0x80) --end;
  std::string out(text.substr(0, end));
  out += "\u2026";
  return out;
}

}  // namespace arbiter
