// libFuzzer target for the tokenizer.json reader and the tokenizer built from
// it: any input must give a Status or a working tokenizer, never a crash, an
// exception or a sanitizer report. A successfully built tokenizer encodes and
// decodes a fixed probe text and a slice of the input itself.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "arbiter/engine/tokenizer.h"
#include "arbiter/formats/tokenizer_json.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view text(reinterpret_cast<const char*>(data), size);
  auto spec = arbiter::ParseTokenizerJson(text, "fuzz/tokenizer.json");
  if (!spec.ok()) return 0;
  auto tok = arbiter::Tokenizer::FromJson(text, "fuzz/tokenizer.json");
  if (!tok.ok()) return 0;
  const arbiter::Tokenizer& t = **tok;
  static const char kProbe[] =
      "Hello <|im_start|>user\nworld's 123 \xC3\xA9t\xC3\xA9 \xE4\xBD\xA0\xFF\xFE  \r\n\t<s>x";
  for (bool special : {true, false}) {
    std::vector<int32_t> ids = t.Encode(kProbe, special);
    (void)t.Decode(ids, false);
    (void)t.Decode(ids, true);
    for (int32_t id : ids) (void)t.TokenBytes(id);
  }
  std::vector<int32_t> ids = t.Encode(text.substr(0, 2048));
  (void)t.Decode(ids);
  int n = t.vocab_size();
  for (int32_t id : {-1, 0, 1, n - 1, n, n + 7}) {
    (void)t.TokenBytes(id);
    (void)t.IsSpecial(id);
  }
  (void)t.TokenId("<|im_end|>");
  return 0;
}
