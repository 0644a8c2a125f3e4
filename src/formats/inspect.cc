// Model inspection: SafetensorsModel + optional config.json → a
// ModelInspection value, rendered as a text table or JSON. Only headers are
// read; tensor data pages are never touched.

#include "arbiter/formats/inspect.h"

#include <sys/stat.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>

#include <nlohmann/json.hpp>

#include "arbiter/base/size.h"

namespace arbiter {
namespace {

using json = nlohmann::json;



std::string Pad(const std::string& s, size_t width) {
  if (s.size() >= width) return s;
  return s + std::string(width - s.size(), ' ');
}

std::string ArchitectureName(Architecture arch) {
  switch (arch) {
    case Architecture::kLlama: return "llama";
    case Architecture::kQwen2: return "qwen2";
    case Architecture::kQwen3: return "qwen3";
  }
  return "?";
}

// "8.03 B", "596.05 M", "12.3 K", "42".
std::string FormatCount(uint64_t n) {
  char buf[64];
  if (n >= 1000000000ull) {
    std::snprintf(buf, sizeof(buf), "%.2f B", static_cast<double>(n) / 1e9);
  } else if (n >= 1000000ull) {
    std::snprintf(buf, sizeof(buf), "%.2f M", static_cast<double>(n) / 1e6);
  } else if (n >= 1000ull) {
    std::snprintf(buf, sizeof(buf), "%.2f K", static_cast<double>(n) / 1e3);
  } else {
    std::snprintf(buf, sizeof(buf), "%llu", static_cast<unsigned long long>(n));
  }
  return buf;
}

std::string IdsText(const std::vector<int>& ids) {
  if (ids.empty()) return "none";
  std::string out;
  for (size_t i = 0; i < ids.size(); ++i) {
    if (i > 0) out += ",";
    out += std::to_string(ids[i]);
  }
  return out;
}

// The double that prints like the float does (1e-06, not 9.99999997e-07).
double ShortestDouble(float f) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.9g", static_cast<double>(f));
  for (int precision = 1; precision <= 9; ++precision) {
    std::snprintf(buf, sizeof(buf), "%.*g", precision, static_cast<double>(f));
    if (std::strtof(buf, nullptr) == f) break;
  }
  return std::strtod(buf, nullptr);
}

json ConfigJson(const ModelConfig& c) {
  json j = json::object();
  j["architecture"] = c.architecture_name;
  j["family"] = ArchitectureName(c.arch);
  j["hidden_size"] = c.hidden_size;
  j["intermediate_size"] = c.intermediate_size;
  j["num_hidden_layers"] = c.num_hidden_layers;
  j["num_attention_heads"] = c.num_attention_heads;
  j["num_key_value_heads"] = c.num_key_value_heads;
  j["head_dim"] = c.head_dim;
  j["rms_norm_eps"] = ShortestDouble(c.rms_norm_eps);
  j["rope_theta"] = ShortestDouble(c.rope_theta);
  j["vocab_size"] = c.vocab_size;
  j["max_position_embeddings"] = c.max_position_embeddings;
  j["tie_word_embeddings"] = c.tie_word_embeddings;
  j["attention_bias"] = c.attention_bias;
  j["qk_norm"] = c.qk_norm;
  j["bos_token_ids"] = c.bos_token_ids;
  j["eos_token_ids"] = c.eos_token_ids;
  j["torch_dtype"] = c.torch_dtype;
  return j;
}

}  // namespace

Result<ModelInspection> InspectModel(const std::string& path) {
  Result<SafetensorsModel> model = SafetensorsModel::Open(path);
  if (!model.ok()) return model.status();

  ModelInspection out;
  out.path = path;
  out.files = model->files();
  out.metadata = model->metadata();
  const std::vector<const TensorInfo*> tensors = model->tensors();
  out.tensors.reserve(tensors.size());
  for (const TensorInfo* t : tensors) {
    InspectedTensor it;
    it.name = t->name;
    it.dtype = t->dtype;
    it.shape = t->shape;
    it.size_bytes = t->size_bytes;
    it.file = t->file;
    out.total_bytes += t->size_bytes;
    out.total_parameters += static_cast<uint64_t>(t->num_elements());
    out.bytes_by_dtype[std::string(DTypeName(t->dtype))] += t->size_bytes;
    out.tensors.push_back(std::move(it));
  }
  out.total_tensors = out.tensors.size();

  struct stat st;
  if (::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode)) {
    std::string config_path = path;
    if (config_path.empty() || config_path.back() != '/') config_path += '/';
    config_path += "config.json";
    if (::stat(config_path.c_str(), &st) == 0) {
      out.config_path = config_path;
      Result<ModelConfig> config = LoadModelConfig(config_path);
      if (config.ok()) {
        out.config = std::move(*config);
      } else {
        out.config_error = config.status().ToString();
      }
    }
  }
  return out;
}

std::string RenderInspectionText(const ModelInspection& m) {
  std::string out;
  out += "path: " + m.path + "\n";
  out += "files (" + std::to_string(m.files.size()) + "):\n";
  for (const std::string& f : m.files) out += "  " + f + "\n";
  if (!m.metadata.empty()) {
    out += "metadata:\n";
    for (const auto& [key, value] : m.metadata) out += "  " + key + " = " + value + "\n";
  }
  if (m.config.has_value()) {
    const ModelConfig& c = *m.config;
    out += "config: " + m.config_path + "\n";
    out += "  architecture        " + c.architecture_name + "\n";
    out += "  layers              " + std::to_string(c.num_hidden_layers) + "\n";
    out += "  hidden / ffn        " + std::to_string(c.hidden_size) + " / " +
           std::to_string(c.intermediate_size) + "\n";
    out += "  heads / kv / dim    " + std::to_string(c.num_attention_heads) + " / " +
           std::to_string(c.num_key_value_heads) + " / " + std::to_string(c.head_dim) + "\n";
    out += "  vocab               " + std::to_string(c.vocab_size) + "\n";
    out += "  max positions       " + std::to_string(c.max_position_embeddings) + "\n";
    char num[64];
    std::snprintf(num, sizeof(num), "%g / %g", static_cast<double>(c.rope_theta),
                  static_cast<double>(c.rms_norm_eps));
    out += "  rope_theta / eps    " + std::string(num) + "\n";
    out += std::string("  tied/bias/qk_norm   ") + (c.tie_word_embeddings ? "yes" : "no") +
           " / " + (c.attention_bias ? "yes" : "no") + " / " + (c.qk_norm ? "yes" : "no") + "\n";
    out += "  bos / eos           " + IdsText(c.bos_token_ids) + " / " + IdsText(c.eos_token_ids) +
           "\n";
    if (!c.torch_dtype.empty()) out += "  torch_dtype         " + c.torch_dtype + "\n";
  } else if (!m.config_error.empty()) {
    out += "config: " + m.config_path + ": " + m.config_error + "\n";
  }

  // Tensor table with columns sized to their contents.
  const bool multi_file = m.files.size() > 1;
  size_t w_name = 4, w_dtype = 5, w_shape = 5, w_size = 4;
  std::vector<std::string> shapes, sizes;
  shapes.reserve(m.tensors.size());
  sizes.reserve(m.tensors.size());
  for (const InspectedTensor& t : m.tensors) {
    shapes.push_back(ShapeString(t.shape));
    sizes.push_back(FormatSize(t.size_bytes));
    w_name = std::max(w_name, t.name.size());
    w_dtype = std::max(w_dtype, DTypeName(t.dtype).size());
    w_shape = std::max(w_shape, shapes.back().size());
    w_size = std::max(w_size, sizes.back().size());
  }
  out += "tensors:\n";
  out += "  " + Pad("NAME", w_name) + "  " + Pad("DTYPE", w_dtype) + "  " + Pad("SHAPE", w_shape) +
         "  " + Pad("SIZE", w_size) + (multi_file ? "  FILE" : "") + "\n";
  for (size_t i = 0; i < m.tensors.size(); ++i) {
    const InspectedTensor& t = m.tensors[i];
    std::string line = "  " + Pad(t.name, w_name) + "  " + Pad(std::string(DTypeName(t.dtype)), w_dtype) +
                       "  " + Pad(shapes[i], w_shape) + "  " + Pad(sizes[i], w_size);
    if (multi_file) line += "  " + std::filesystem::path(t.file).filename().string();
    while (!line.empty() && line.back() == ' ') line.pop_back();
    out += line + "\n";
  }
  out += "totals: " + std::to_string(m.total_tensors) + " tensors, " + FormatSize(m.total_bytes) +
         " (" + std::to_string(m.total_bytes) + " bytes), " + FormatCount(m.total_parameters) +
         " parameters (" + std::to_string(m.total_parameters) + ")\n";
  for (const auto& [dtype, bytes] : m.bytes_by_dtype) {
    out += "  " + Pad(dtype, 8) + FormatSize(bytes) + "\n";
  }
  return out;
}

std::string RenderInspectionJson(const ModelInspection& m) {
  json j = json::object();
  j["path"] = m.path;
  j["files"] = m.files;
  json tensors = json::array();
  for (const InspectedTensor& t : m.tensors) {
    json e = json::object();
    e["name"] = t.name;
    e["dtype"] = std::string(DTypeName(t.dtype));
    e["shape"] = t.shape;
    e["bytes"] = t.size_bytes;
    e["file"] = t.file;
    tensors.push_back(std::move(e));
  }
  j["tensors"] = std::move(tensors);
  j["metadata"] = m.metadata;
  json totals = json::object();
  totals["tensors"] = m.total_tensors;
  totals["bytes"] = m.total_bytes;
  totals["parameters"] = m.total_parameters;
  totals["bytes_by_dtype"] = m.bytes_by_dtype;
  j["totals"] = std::move(totals);
  if (m.config.has_value()) j["config"] = ConfigJson(*m.config);
  if (!m.config_error.empty()) j["config_error"] = m.config_error;
  return j.dump(-1, ' ', false, json::error_handler_t::replace);
}

}  // namespace arbiter
