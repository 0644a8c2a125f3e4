// libFuzzer target for the JSON schema → GBNF compiler: any input must give
// a Status or GBNF text, never a crash, a hang or a sanitizer report; and
// GBNF it returns must parse (the compiler checks its output, so a parse
// failure here is a compiler bug), under its own name as well; and it must
// not admit numbers that parse to an infinity or a subnormal/underflowed
// double (Note [Numbers every client can read] in json_schema.cc): any
// sentence that is such a bare number is one of those texts.
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
  for (const char* unreadable : {"1e999", "-6E688", "886.6E-999", "1e-400", "4.9e-324", "2e308", "9e99999"}) {
    if ((*g)->Matches(unreadable)) std::abort();
  }
  (void)(*g)->Matches("{}");
  (void)(*g)->Matches("\"x\"");
  return 0;
}
