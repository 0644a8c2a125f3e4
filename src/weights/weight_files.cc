// weights/weight_files.cc — argument order, footprint, file token and layout
// digest of a model's weights (docs/weights.md).
//
// All of it reads safetensors headers only. The argument order is the
// contract between the file and the runtime: the order tensors are
// materialized into a host floor, transferred to the device and laid out in
// a shared region. When a file does not carry one, a Llama-family model's
// order comes from the same list the engine loads
// (arbiter/formats/llama_tensors.h), so there is exactly one definition.
#include "arbiter/weights/weight_files.h"

#include <sys/stat.h>

#include <filesystem>
#include <set>
#include <string>

#include <nlohmann/json.hpp>

#include "arbiter/base/hash.h"
#include "arbiter/formats/llama_tensors.h"

namespace arbiter {
namespace {

// How errors name the model: its file, or its directory when sharded.
std::string ModelName(const SafetensorsModel& model) {
  const std::vector<std::string>& files = model.files();
  if (files.empty()) return "<no file>";
  if (files.size() == 1) return files[0];
  return std::filesystem::path(files[0]).parent_path().string();
}

Result<std::vector<std::string>> ParseArgumentOrder(const SafetensorsModel& model,
                                                    const std::string& text) {
  const std::string where = ModelName(model) + ": __metadata__[\"" +
                            std::string(kArgumentOrderKey) + "\"]";
  nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) {
    return DataLossError(where + " is not valid JSON; expected a JSON list of tensor names");
  }
  if (!j.is_array()) {
    return DataLossError(where + " is a JSON " + std::string(j.type_name()) +
                         "; expected a list of tensor names");
  }
  std::vector<std::string> order;
  order.reserve(j.size());
  std::set<std::string, std::less<>> seen;
  for (size_t i = 0; i < j.size(); ++i) {
    if (!j[i].is_string()) {
      return DataLossError(where + " entry " + std::to_string(i) + " is a JSON " +
                           std::string(j[i].type_name()) + "; expected a tensor name (string)");
    }
    std::string name = j[i].get<std::string>();
    if (!seen.insert(name).second) {
      return DataLossError(where + " lists weight '" + name + "' twice");
    }
    if (model.Find(name) == nullptr) {
      return DataLossError(ModelName(model) + ": weight '" + name + "' missing (listed in " +
                           "__metadata__[\"" + std::string(kArgumentOrderKey) + "\"])");
    }
    order.push_back(std::move(name));
  }
  return order;
}

}  // namespace

Result<std::vector<std::string>> WeightOrder(const SafetensorsModel& model,
                                             const ModelConfig* architecture) {
  auto it = model.metadata().find(std::string(kArgumentOrderKey));
  if (it != model.metadata().end()) return ParseArgumentOrder(model, it->second);
  if (model.tensors().empty()) return std::vector<std::string>{};
  if (architecture == nullptr) {
    return FailedPreconditionError(
        ModelName(model) + ": has tensors but no '" + std::string(kArgumentOrderKey) +
        "' metadata; give the model's architecture (config.json) or add __metadata__[\"" +
        std::string(kArgumentOrderKey) + "\"]");
  }
  const LlamaTensorPlan plan = PlanLlamaTensors(*architecture, model);
  std::vector<std::string> order;
  order.reserve(plan.tensors.size());
  for (const LlamaTensor& t : plan.tensors) {
    if (model.Find(t.name) == nullptr) {
      return NotFoundError(ModelName(model) + ": weight '" + t.name + "' missing (required by " +
                           (architecture->architecture_name.empty()
                                ? std::string("the architecture")
                                : architecture->architecture_name) +
                           " with " + std::to_string(architecture->num_hidden_layers) +
                           " layers)");
    }
    order.push_back(t.name);
  }
  return order;
}

Result<std::vector<WeightSpec>> WeightSpecs(const SafetensorsModel& model,
                                            const std::vector<std::string>& names) {
  std::vector<WeightSpec> specs;
  specs.reserve(names.size());
  for (const std::string& name : names) {
    const TensorInfo* t = model.Find(name);
    if (t == nullptr) {
      return NotFoundError(ModelName(model) + ": no tensor '" + name + "'");
    }
    specs.push_back(WeightSpec{t->name, t->dtype, t->shape});
  }
  return specs;
}

Result<size_t> WeightsNbytes(const SafetensorsModel& model,
                             const std::vector<std::string>& names) {
  uint64_t total = 0;
  for (const std::string& name : names) {
    const TensorInfo* t = model.Find(name);
    if (t == nullptr) {
      return NotFoundError(ModelName(model) + ": no tensor '" + name + "'");
    }
    // The reader has checked prod(shape) × element size == the tensor's byte
    // range, so each term fits; only the sum could overflow.
    const uint64_t bytes = static_cast<uint64_t>(t->num_elements()) * DTypeSize(t->dtype);
    if (__builtin_add_overflow(total, bytes, &total)) {
      return OutOfRangeError(ModelName(model) + ": weight bytes overflow 64 bits");
    }
  }
  return total;
}

uint64_t WeightsFileToken(const std::string& path) {
  if (path.empty()) return 0;
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) return 0;
  const uint64_t mtime_ns = static_cast<uint64_t>(st.st_mtim.tv_sec) * 1000000000ull +
                            static_cast<uint64_t>(st.st_mtim.tv_nsec);
  const std::string text =
      std::to_string(static_cast<uint64_t>(st.st_size)) + ":" + std::to_string(mtime_ns);
  const uint64_t h = Xxh3_64(text.data(), text.size());
  return h == 0 ? 1 : h;
}

std::string WeightsDigestPreimage(std::string_view model_key,
                                  const std::vector<WeightSpec>& specs, uint64_t content_token) {
  // Plain appends (no "literal" + std::string temporaries: GCC 12 warns
  // spuriously on those under -O3, -Wrestrict).
  std::string s;
  s.reserve(64 + model_key.size() + specs.size() * 64);
  auto num = [&s](auto v) { s.append(std::to_string(v)); };
  s.append(kWeightsDigestFormatV1);
  s.append("\nkey ");
  num(model_key.size());
  s.push_back(':');
  s.append(model_key);
  s.append("\ncontent ");
  num(content_token);
  s.append("\ntensors ");
  num(specs.size());
  s.push_back('\n');
  for (const WeightSpec& spec : specs) {
    num(spec.name.size());
    s.push_back(':');
    s.append(spec.name);
    s.push_back(' ');
    if (spec.ggml_type) {
      const std::optional<GgmlTypeTraits> t = GgmlTypeTraitsOf(*spec.ggml_type);
      s.append("ggml:");
      s.append(GgmlTypeName(*spec.ggml_type));
      s.push_back(' ');
      num(t ? t->block_elems : 0);
      s.push_back('/');
      num(t ? t->block_bytes : 0);
    } else {
      s.append(DTypeName(spec.dtype));
      s.push_back(' ');
      num(DTypeSize(spec.dtype));
    }
    s.append(" [");
    for (size_t i = 0; i < spec.shape.size(); ++i) {
      if (i > 0) s.push_back(',');
      num(spec.shape[i]);
    }
    s.append("]\n");
  }
  return s;
}

uint64_t WeightsDigest(std::string_view model_key, const std::vector<WeightSpec>& specs,
                       uint64_t content_token) {
  const std::string preimage = WeightsDigestPreimage(model_key, specs, content_token);
  return Xxh3_64(preimage.data(), preimage.size());
}

}  // namespace arbiter
