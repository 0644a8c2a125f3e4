// libFuzzer target: ParseModelConfig on arbitrary text. Accepted configs
// must satisfy the invariants model_config.h promises.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "arbiter/formats/model_config.h"
#include "model_config_checks.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view text(reinterpret_cast<const char*>(data), size);
  arbiter::Result<arbiter::ModelConfig> config = arbiter::ParseModelConfig(text, "config.json");
  if (!config.ok()) return 0;
  CheckModelConfigInvariants(*config);
  return 0;
}
