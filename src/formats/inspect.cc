// Model inspection: a GGUF file (OpenGguf + ModelConfigFromGguf), or
// SafetensorsModel + optional config.json → a ModelInspection value, rendered
// as a text table or JSON. Only headers are read; tensor data pages are
// never touched.

#include "arbiter/formats/inspect.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>

#include <nlohmann/json.hpp>

#include "arbiter/base/fd.h"
#include "arbiter/base/size.h"
#include "arbiter/formats/safetensors.h"

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

// ---- GGUF metadata values -------------------------------------------------

// Items of an array shown; strings cut at this many bytes in text.
constexpr size_t kArrayItems = 8;
constexpr size_t kTextStringBytes = 80;

// A regular file named *.gguf or starting with the GGUF magic.
bool IsGgufPath(const std::string& path) {
  if (path.size() >= 5 && path.compare(path.size() - 5, 5, ".gguf") == 0) return true;
  struct stat st;
  if (::stat(path.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) return false;
  Result<UniqueFd> fd = UniqueFd::Open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (!fd.ok()) return false;
  char magic[4];
  return ::pread(fd->get(), magic, 4, 0) == 4 && std::memcmp(magic, "GGUF", 4) == 0;
}

// "u32", "array[string]".
std::string TypeText(const GgufValue& v) {
  if (!v.is_array()) return std::string(GgufValueTypeName(v.type()));
  return "array[" + std::string(GgufValueTypeName(v.element_type())) + "]";
}

// "\"text\"", escaped, cut at `max` bytes with the full length after it.
std::string QuoteText(std::string_view s, size_t max) {
  std::string out = "\"";
  const size_t n = std::min(s.size(), max);
  for (size_t i = 0; i < n; ++i) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    if (c == '"' || c == '\\') {
      out.push_back('\\');
      out.push_back(static_cast<char>(c));
    } else if (c == '\n') {
      out += "\\n";
    } else if (c < 0x20 || c == 0x7f) {
      char buf[8];
      std::snprintf(buf, sizeof(buf), "\\x%02x", c);
      out += buf;
    } else {
      out.push_back(static_cast<char>(c));
    }
  }
  out += "\"";
  if (n < s.size()) out += "... (" + std::to_string(s.size()) + " bytes)";
  return out;
}

// The shortest text that reads back as the same float (or double).
std::string FloatText(double d, bool is_f32) {
  char buf[40];
  for (int precision = 1; precision <= 17; ++precision) {
    std::snprintf(buf, sizeof(buf), "%.*g", precision, d);
    if (is_f32 ? std::strtof(buf, nullptr) == static_cast<float>(d)
               : std::strtod(buf, nullptr) == d) {
      break;
    }
  }
  return buf;
}

std::string ScalarText(const GgufValue& v) {
  if (std::optional<std::string_view> s = v.AsString()) return QuoteText(*s, kTextStringBytes);
  if (std::optional<bool> b = v.AsBool()) return *b ? "true" : "false";
  if (std::optional<double> d = v.AsFloat()) {
    return FloatText(*d, v.type() == GgufValueType::kFloat32);
  }
  if (std::optional<int64_t> i = v.AsInt()) return std::to_string(*i);
  if (std::optional<uint64_t> u = v.AsUint()) return std::to_string(*u);
  return "?";
}

// A value in one line: scalars as themselves, arrays as their first items
// ("151936 items: [...]" when cut); an array inside an array as
// "[N × type]".
std::string ValueText(const GgufValue& v, int depth) {
  if (!v.is_array()) return ScalarText(v);
  if (depth > 0) {
    return "[" + std::to_string(v.size()) + " × " +
           std::string(GgufValueTypeName(v.element_type())) + "]";
  }
  const size_t shown = std::min(v.size(), kArrayItems);
  std::string out = v.size() > kArrayItems ? std::to_string(v.size()) + " items: [" : "[";
  for (size_t i = 0; i < shown; ++i) {
    if (i > 0) out += ", ";
    if (v.element_type() == GgufValueType::kString) {
      out += QuoteText(v.StringAt(i), kTextStringBytes);
    } else if (v.element_type() == GgufValueType::kArray) {
      out += ValueText(v.ArrayAt(i), depth + 1);
    } else {
      out += ScalarText(v.At(i));
    }
  }
  if (v.size() > kArrayItems) out += ", ...";
  return out + "]";
}

json ScalarJson(const GgufValue& v) {
  if (std::optional<std::string_view> s = v.AsString()) return std::string(*s);
  if (std::optional<bool> b = v.AsBool()) return *b;
  if (std::optional<double> d = v.AsFloat()) {
    if (!std::isfinite(*d)) return nullptr;
    return v.type() == GgufValueType::kFloat32 ? ShortestDouble(static_cast<float>(*d)) : *d;
  }
  if (std::optional<int64_t> i = v.AsInt()) return *i;
  if (std::optional<uint64_t> u = v.AsUint()) return *u;
  return nullptr;
}

// Note the JSON shape in inspect.h.
json ValueJson(const GgufValue& v, int depth) {
  json j = json::object();
  if (!v.is_array()) {
    j["type"] = std::string(GgufValueTypeName(v.type()));
    j["value"] = ScalarJson(v);
    return j;
  }
  j["type"] = "array";
  j["element_type"] = std::string(GgufValueTypeName(v.element_type()));
  j["count"] = v.size();
  if (depth > 0) return j;
  json items = json::array();
  const size_t shown = std::min(v.size(), kArrayItems);
  for (size_t i = 0; i < shown; ++i) {
    if (v.element_type() == GgufValueType::kString) {
      items.push_back(std::string(v.StringAt(i)));
    } else if (v.element_type() == GgufValueType::kArray) {
      items.push_back(ValueJson(v.ArrayAt(i), depth + 1));
    } else {
      items.push_back(ScalarJson(v.At(i)));
    }
  }
  j["value"] = std::move(items);
  j["truncated"] = v.size() > kArrayItems;
  return j;
}

}  // namespace

ModelInspection InspectGguf(const GgufFile& gguf) {
  ModelInspection out;
  out.path = gguf.name();
  out.format = "gguf";
  out.files = {gguf.name()};
  out.gguf_version = gguf.version();
  out.gguf_alignment = gguf.alignment();
  out.gguf_data_offset = gguf.data_offset();
  out.gguf_metadata = gguf.metadata();
  out.tensors.reserve(gguf.tensors().size());
  for (const GgufTensorInfo& t : gguf.tensors()) {
    InspectedTensor it;
    it.name = t.name;
    it.dtype = std::string(GgmlTypeName(t.type));
    it.shape = t.RowMajorShape();
    it.size_bytes = t.size_bytes;
    it.file = gguf.name();
    out.total_bytes += t.size_bytes;
    out.total_parameters += static_cast<uint64_t>(t.n_elements);
    out.bytes_by_dtype[it.dtype] += t.size_bytes;
    out.tensors.push_back(std::move(it));
  }
  out.total_tensors = out.tensors.size();
  // A GGUF file without general.architecture (a test file, a vocabulary)
  // describes no model: like a safetensors file without config.json.
  if (gguf.FindValue("general.architecture") == nullptr) return out;
  out.config_path = gguf.name();
  Result<ModelConfig> config = ModelConfigFromGguf(gguf);
  if (config.ok()) {
    out.config = std::move(*config);
  } else {
    out.config_error = config.status().ToString();
  }
  return out;
}

Result<ModelInspection> InspectModel(const std::string& path) {
  if (IsGgufPath(path)) {
    Result<GgufFile> gguf = OpenGguf(path);
    if (!gguf.ok()) return gguf.status();
    return InspectGguf(*gguf);
  }
  Result<SafetensorsModel> model = SafetensorsModel::Open(path);
  if (!model.ok()) return model.status();

  ModelInspection out;
  out.path = path;
  out.format = "safetensors";
  out.files = model->files();
  out.metadata = model->metadata();
  const std::vector<const TensorInfo*> tensors = model->tensors();
  out.tensors.reserve(tensors.size());
  for (const TensorInfo* t : tensors) {
    InspectedTensor it;
    it.name = t->name;
    it.dtype = std::string(DTypeName(t->dtype));
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
  if (m.format == "gguf") {
    out += "format: GGUF version " + std::to_string(m.gguf_version) + ", alignment " +
           std::to_string(m.gguf_alignment) + ", data section at byte " +
           std::to_string(m.gguf_data_offset) + "\n";
  }
  out += "files (" + std::to_string(m.files.size()) + "):\n";
  for (const std::string& f : m.files) out += "  " + f + "\n";
  if (!m.gguf_metadata.empty()) {
    size_t w_key = 0, w_type = 0;
    for (const GgufMetadataEntry& e : m.gguf_metadata) {
      w_key = std::max(w_key, std::min<size_t>(e.key.size(), 48));
      w_type = std::max(w_type, TypeText(e.value).size());
    }
    out += "metadata (" + std::to_string(m.gguf_metadata.size()) + "):\n";
    for (const GgufMetadataEntry& e : m.gguf_metadata) {
      out += "  " + Pad(e.key, w_key) + "  " + Pad(TypeText(e.value), w_type) + "  " +
             ValueText(e.value, 0) + "\n";
    }
  }
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
    w_dtype = std::max(w_dtype, t.dtype.size());
    w_shape = std::max(w_shape, shapes.back().size());
    w_size = std::max(w_size, sizes.back().size());
  }
  out += "tensors:\n";
  out += "  " + Pad("NAME", w_name) + "  " + Pad("DTYPE", w_dtype) + "  " + Pad("SHAPE", w_shape) +
         "  " + Pad("SIZE", w_size) + (multi_file ? "  FILE" : "") + "\n";
  for (size_t i = 0; i < m.tensors.size(); ++i) {
    const InspectedTensor& t = m.tensors[i];
    std::string line = "  " + Pad(t.name, w_name) + "  " + Pad(t.dtype, w_dtype) +
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
  j["format"] = m.format;
  j["files"] = m.files;
  json tensors = json::array();
  for (const InspectedTensor& t : m.tensors) {
    json e = json::object();
    e["name"] = t.name;
    e["dtype"] = t.dtype;
    e["shape"] = t.shape;
    e["bytes"] = t.size_bytes;
    e["file"] = t.file;
    tensors.push_back(std::move(e));
  }
  j["tensors"] = std::move(tensors);
  if (m.format == "gguf") {
    json meta = json::object();
    for (const GgufMetadataEntry& e : m.gguf_metadata) meta[e.key] = ValueJson(e.value, 0);
    j["metadata"] = std::move(meta);
    j["gguf"] = {{"version", m.gguf_version},
                 {"alignment", m.gguf_alignment},
                 {"data_offset", m.gguf_data_offset}};
  } else {
    j["metadata"] = m.metadata;
  }
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
