// libFuzzer target for the JSON schema → GBNF compiler: any input must give
// a Status or GBNF text, never a crash, a hang or a sanitizer report; and
// GBNF it returns must parse (the compiler checks its output, so a parse
// failure here is a compiler bug), under its own name as well.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>

#include "arbiter/engine/grammar.h"
#include "arbiter/engine/json_schema.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view text(reinterpret_cast<const char*>(data), size);
  auto gbnf = arbiter::JsonSchemaToGbnf(text);
  if (!gbnf.ok()) return 0;
  auto g = arbiter::Grammar::Parse(*gbnf);
  if (!g.ok()) std::abort();
  auto named = arbiter::JsonSchemaToGbnf(text, "args0");
  if (!named.ok()) std::abort();
  if (!arbiter::Grammar::Parse("root ::= args0\n" + *named).ok()) std::abort();
  (void)(*g)->Matches("{}");
  (void)(*g)->Matches("\"x\"");
  return 0;
}
