// safetensors reader and writer.
//
// Reading is "validate everything, then expose": Parse() walks the 8-byte
// length, the JSON header and every tensor entry, and only builds the
// SafetensorsFile once all of the checks listed in safetensors.h hold. The
// JSON is parsed by nlohmann::json with exceptions; every exception is caught
// in this file and turned into kDataLoss, so no exception reaches a caller.
//
// Note [Header depth]: a valid header is at most three levels deep
// (object → tensor object → shape array). The parser callback rejects
// anything deeper than kMaxJsonDepth, so a hostile header of a million '['
// costs nothing to reject. The same callback rejects a tensor name that
// appears twice at the top level (nlohmann would silently keep the last one).
//
// Note [Overlap check]: tensors are sorted by data_offsets begin; a tensor
// overlaps its predecessor when its begin is before the furthest end seen so
// far. Zero-byte tensors occupy nothing and are skipped. Holes between
// tensors are allowed (the reference implementation rejects them; we only
// need memory safety and unambiguous ownership of every byte).
//
// Tensor data is never assumed aligned: the header length is arbitrary, so
// all element loads go through memcpy.

#include "arbiter/formats/safetensors.h"

#include <sys/stat.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <set>
#include <utility>

#include <nlohmann/json.hpp>

#include "formats/internal/json_type_name.h"

namespace arbiter {
namespace {

using json = nlohmann::json;

constexpr int kMaxJsonDepth = 8;
// Largest index.json we read; real ones are well under 1 MiB.
constexpr size_t kMaxIndexBytes = 64u << 20;

struct DTypeEntry {
  DType dtype;
  std::string_view name;
  size_t size_bytes;
};

constexpr DTypeEntry kDTypes[] = {
    {DType::kF64, "F64", 8},       {DType::kF32, "F32", 4},     {DType::kF16, "F16", 2},
    {DType::kBF16, "BF16", 2},     {DType::kI64, "I64", 8},     {DType::kI32, "I32", 4},
    {DType::kI16, "I16", 2},       {DType::kI8, "I8", 1},       {DType::kU64, "U64", 8},
    {DType::kU32, "U32", 4},       {DType::kU16, "U16", 2},     {DType::kU8, "U8", 1},
    {DType::kBool, "BOOL", 1},     {DType::kF8E4M3, "F8_E4M3", 1},
    {DType::kF8E5M2, "F8_E5M2", 1},
};

std::string Quote(std::string_view s) {
  std::string out;
  out.reserve(s.size() + 2);
  out.push_back('"');
  out.append(s);
  out.push_back('"');
  return out;
}


using formats_internal::JsonTypeName;

// prod(shape) × elem_size into *bytes; false on a negative dim or overflow.
bool ShapeBytes(const std::vector<int64_t>& shape, size_t elem_size, uint64_t* bytes) {
  uint64_t n = elem_size;
  for (int64_t d : shape) {
    if (d < 0) return false;
    if (__builtin_mul_overflow(n, static_cast<uint64_t>(d), &n)) return false;
  }
  *bytes = n;
  return true;
}

// Parses JSON text with the depth limit of Note [Header depth]. When
// `reject_duplicate_keys`, a key repeated in the top-level object is an
// error. Throws nlohmann exceptions or std::runtime_error; callers catch.
json ParseJsonLimited(const char* begin, const char* end, bool reject_duplicate_keys) {
  std::set<std::string> top_keys;
  json::parser_callback_t cb = [&](int depth, json::parse_event_t event, json& parsed) {
    if (depth > kMaxJsonDepth) {
      throw std::runtime_error("JSON nested deeper than " + std::to_string(kMaxJsonDepth) +
                               " levels");
    }
    if (reject_duplicate_keys && event == json::parse_event_t::key && depth == 1) {
      const std::string& key = parsed.get_ref<const std::string&>();
      if (!top_keys.insert(key).second) {
        throw std::runtime_error("key " + Quote(key) + " appears twice");
      }
    }
    return true;
  };
  return json::parse(begin, end, cb, /*allow_exceptions=*/true, /*ignore_comments=*/false);
}

Status ParseTensorEntry(const std::string& file, const std::string& name, const json& entry,
                        uint64_t data_size, TensorInfo* out) {
  const std::string where = file + ": tensor " + Quote(name);
  if (!entry.is_object()) {
    return DataLossError(where + ": entry is " + JsonTypeName(entry) + ", expected an object");
  }
  auto dtype_it = entry.find("dtype");
  auto shape_it = entry.find("shape");
  auto offsets_it = entry.find("data_offsets");
  if (dtype_it == entry.end()) return DataLossError(where + ": field \"dtype\" is missing");
  if (shape_it == entry.end()) return DataLossError(where + ": field \"shape\" is missing");
  if (offsets_it == entry.end()) {
    return DataLossError(where + ": field \"data_offsets\" is missing");
  }

  if (!dtype_it->is_string()) {
    return DataLossError(where + ": field \"dtype\" is " + JsonTypeName(*dtype_it) +
                         ", expected a string");
  }
  Result<DType> dtype = ParseDType(dtype_it->get_ref<const std::string&>());
  if (!dtype.ok()) return dtype.status().WithPrefix(where);

  if (!shape_it->is_array()) {
    return DataLossError(where + ": field \"shape\" is " + JsonTypeName(*shape_it) +
                         ", expected an array of integers");
  }
  std::vector<int64_t> shape;
  shape.reserve(shape_it->size());
  for (const json& d : *shape_it) {
    if (d.is_number_unsigned()) {
      uint64_t v = d.get<uint64_t>();
      if (v > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
        return DataLossError(where + ": shape dimension " + std::to_string(v) + " is too large");
      }
      shape.push_back(static_cast<int64_t>(v));
    } else if (d.is_number_integer()) {
      return DataLossError(where + ": shape dimension " + std::to_string(d.get<int64_t>()) +
                           " is negative");
    } else {
      return DataLossError(where + ": field \"shape\" holds " + JsonTypeName(d) +
                           ", expected non-negative integers");
    }
  }

  if (!offsets_it->is_array() || offsets_it->size() != 2 || !(*offsets_it)[0].is_number_integer() ||
      !(*offsets_it)[1].is_number_integer()) {
    return DataLossError(where + ": field \"data_offsets\" must be an array of two integers [begin, end], got " +
                         offsets_it->dump(-1, ' ', false, json::error_handler_t::replace));
  }
  const json& jb = (*offsets_it)[0];
  const json& je = (*offsets_it)[1];
  if (!jb.is_number_unsigned() || !je.is_number_unsigned()) {
    return DataLossError(where + ": data_offsets " + offsets_it->dump() + " are negative");
  }
  uint64_t begin = jb.get<uint64_t>();
  uint64_t end = je.get<uint64_t>();
  const std::string offsets_text = "data_offsets [" + std::to_string(begin) + ", " + std::to_string(end) + "]";
  if (begin > end) {
    return DataLossError(where + ": " + offsets_text + " has begin after end");
  }
  if (end > data_size) {
    return DataLossError(where + ": " + offsets_text + " ends past the data area (" +
                         std::to_string(data_size) + " bytes); the file is truncated or corrupt");
  }

  const size_t elem = DTypeSize(*dtype);
  uint64_t need = 0;
  if (!ShapeBytes(shape, elem, &need)) {
    return DataLossError(where + ": shape " + ShapeString(shape) + " of " +
                         std::string(DTypeName(*dtype)) + " overflows 64 bits");
  }
  if (end - begin != need) {
    return DataLossError(where + ": " + offsets_text + " hold " + std::to_string(end - begin) +
                         " bytes but shape " + ShapeString(shape) + " of " +
                         std::string(DTypeName(*dtype)) + " needs " + std::to_string(need));
  }

  out->name = name;
  out->dtype = *dtype;
  out->shape = std::move(shape);
  out->size_bytes = static_cast<size_t>(end - begin);
  out->data_begin = begin;
  out->file = file;
  return OkStatus();
}

bool IsDirectory(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

bool Exists(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0;
}

std::string JoinPath(const std::string& dir, const std::string& name) {
  if (!dir.empty() && dir.back() == '/') return dir + name;
  return dir + "/" + name;
}

// True when `name` stays inside the model directory: relative, no ".."
// component, not empty.
bool IsSafeShardName(const std::string& name) {
  if (name.empty() || name[0] == '/') return false;
  size_t start = 0;
  while (start <= name.size()) {
    size_t slash = name.find('/', start);
    if (slash == std::string::npos) slash = name.size();
    std::string_view part(name.data() + start, slash - start);
    if (part == "..") return false;
    start = slash + 1;
  }
  return true;
}

}  // namespace

// ---------------------------------------------------------------------------
// DTypes

std::string_view DTypeName(DType dtype) {
  for (const DTypeEntry& e : kDTypes) {
    if (e.dtype == dtype) return e.name;
  }
  return "?";
}

size_t DTypeSize(DType dtype) {
  for (const DTypeEntry& e : kDTypes) {
    if (e.dtype == dtype) return e.size_bytes;
  }
  return 0;
}

Result<DType> ParseDType(std::string_view name) {
  for (const DTypeEntry& e : kDTypes) {
    if (e.name == name) return e.dtype;
  }
  return DataLossError("unknown dtype " + Quote(name) +
                       " (known: F64, F32, F16, BF16, I64, I32, I16, I8, U64, U32, U16, U8, "
                       "BOOL, F8_E4M3, F8_E5M2)");
}

int64_t TensorInfo::num_elements() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

// ---------------------------------------------------------------------------
// SafetensorsFile

Result<SafetensorsFile> SafetensorsFile::Open(const std::string& path) {
  Result<MappedFile> mapped = MappedFile::Open(path);
  if (!mapped.ok()) return mapped.status();
  auto map = std::make_shared<MappedFile>(std::move(*mapped));
  Result<SafetensorsFile> file = Parse(map->data(), map->size(), path);
  if (!file.ok()) return file.status();
  file->map_ = std::move(map);
  file->path_ = path;
  return file;
}

Result<SafetensorsFile> SafetensorsFile::Parse(const uint8_t* bytes, size_t size,
                                               const std::string& name) {
  if (size < 8) {
    return DataLossError(name + ": file is " + std::to_string(size) +
                         " bytes, shorter than the 8-byte header length; it is truncated or not "
                         "a safetensors file");
  }
  uint64_t header_bytes = 0;
  for (int i = 7; i >= 0; --i) header_bytes = (header_bytes << 8) | bytes[i];
  if (header_bytes < 2) {
    return DataLossError(name + ": header length " + std::to_string(header_bytes) +
                         " is too small for a JSON object; not a safetensors file");
  }
  if (header_bytes > kMaxHeaderBytes) {
    return DataLossError(name + ": header length " + std::to_string(header_bytes) +
                         " exceeds the 100 MiB limit; the file is corrupt or not safetensors");
  }
  if (header_bytes > size - 8) {
    return DataLossError(name + ": header length " + std::to_string(header_bytes) +
                         " runs past the end of the " + std::to_string(size) +
                         "-byte file; the file is truncated");
  }
  const char* header_begin = reinterpret_cast<const char*>(bytes + 8);
  const uint8_t* data_area = bytes + 8 + header_bytes;
  const uint64_t data_size = size - 8 - header_bytes;

  json header;
  try {
    header = ParseJsonLimited(header_begin, header_begin + header_bytes,
                              /*reject_duplicate_keys=*/true);
  } catch (const std::exception& e) {
    return DataLossError(name + ": header is not valid JSON: " + e.what());
  }
  if (!header.is_object()) {
    return DataLossError(name + ": header is " + JsonTypeName(header) + ", expected a JSON object");
  }

  SafetensorsFile file;
  file.path_ = name;
  file.file_size_ = size;
  try {
    file.tensors_.reserve(header.size());
    for (auto it = header.begin(); it != header.end(); ++it) {
      const std::string& key = it.key();
      if (key == "__metadata__") {
        if (!it->is_object()) {
          return DataLossError(name + ": field \"__metadata__\" is " + JsonTypeName(*it) +
                               ", expected an object of strings");
        }
        for (auto m = it->begin(); m != it->end(); ++m) {
          if (!m->is_string()) {
            return DataLossError(name + ": __metadata__ entry " + Quote(m.key()) + " is " +
                                 JsonTypeName(*m) + ", expected a string");
          }
          file.metadata_[m.key()] = m->get<std::string>();
        }
        continue;
      }
      TensorInfo info;
      ARBITER_RETURN_IF_ERROR(ParseTensorEntry(name, key, *it, data_size, &info));
      info.data = data_area + info.data_begin;
      file.tensors_.push_back(std::move(info));
    }
  } catch (const std::exception& e) {
    // Not expected: every access above checks types first.
    return DataLossError(name + ": malformed header: " + e.what());
  }

  // Note [Overlap check].
  std::vector<const TensorInfo*> by_offset;
  by_offset.reserve(file.tensors_.size());
  for (const TensorInfo& t : file.tensors_) {
    if (t.size_bytes > 0) by_offset.push_back(&t);
  }
  std::sort(by_offset.begin(), by_offset.end(), [](const TensorInfo* a, const TensorInfo* b) {
    return a->data_begin < b->data_begin;
  });
  const TensorInfo* furthest = nullptr;
  for (const TensorInfo* t : by_offset) {
    if (furthest != nullptr && t->data_begin < furthest->data_begin + furthest->size_bytes) {
      return DataLossError(name + ": tensor " + Quote(t->name) + " (data_offsets [" +
                           std::to_string(t->data_begin) + ", " +
                           std::to_string(t->data_begin + t->size_bytes) +
                           "]) overlaps tensor " + Quote(furthest->name) + " (data_offsets [" +
                           std::to_string(furthest->data_begin) + ", " +
                           std::to_string(furthest->data_begin + furthest->size_bytes) + "])");
    }
    if (furthest == nullptr ||
        t->data_begin + t->size_bytes > furthest->data_begin + furthest->size_bytes) {
      furthest = t;
    }
  }
  // tensors_ is in header-key order, which nlohmann keeps sorted by name;
  // Find() relies on that.
  return file;
}

const TensorInfo* SafetensorsFile::Find(std::string_view name) const {
  auto it = std::lower_bound(tensors_.begin(), tensors_.end(), name,
                             [](const TensorInfo& t, std::string_view n) { return t.name < n; });
  if (it == tensors_.end() || it->name != name) return nullptr;
  return &*it;
}

// ---------------------------------------------------------------------------
// SafetensorsModel

Result<SafetensorsModel> SafetensorsModel::Open(const std::string& path) {
  std::vector<std::string> shard_paths;
  // Tensor name → shard file name, as the index claims; empty when unsharded.
  std::map<std::string, std::string> weight_map;
  std::string index_path;

  if (!IsDirectory(path)) {
    if (!Exists(path)) {
      return NotFoundError(path + ": no such file or directory; pass a .safetensors file or a "
                           "model directory");
    }
    shard_paths.push_back(path);
  } else {
    index_path = JoinPath(path, "model.safetensors.index.json");
    const std::string single = JoinPath(path, "model.safetensors");
    if (!Exists(index_path)) {
      index_path.clear();
      if (!Exists(single)) {
        return NotFoundError(path + ": directory holds neither model.safetensors nor "
                             "model.safetensors.index.json");
      }
      shard_paths.push_back(single);
    }
  }

  if (!index_path.empty()) {
    Result<std::string> text = ReadFile(index_path, kMaxIndexBytes);
    if (!text.ok()) return text.status();
    json index;
    try {
      index = ParseJsonLimited(text->data(), text->data() + text->size(),
                               /*reject_duplicate_keys=*/false);
    } catch (const std::exception& e) {
      return DataLossError(index_path + ": not valid JSON: " + e.what());
    }
    if (!index.is_object()) {
      return DataLossError(index_path + ": top level is " + JsonTypeName(index) +
                           ", expected a JSON object");
    }
    auto wm = index.find("weight_map");
    if (wm == index.end()) return DataLossError(index_path + ": field \"weight_map\" is missing");
    if (!wm->is_object()) {
      return DataLossError(index_path + ": field \"weight_map\" is " + JsonTypeName(*wm) +
                           ", expected an object of tensor name → shard file");
    }
    if (wm->empty()) return DataLossError(index_path + ": field \"weight_map\" is empty");
    std::set<std::string> shard_names;
    for (auto it = wm->begin(); it != wm->end(); ++it) {
      if (!it->is_string()) {
        return DataLossError(index_path + ": weight_map entry for tensor " + Quote(it.key()) +
                             " is " + JsonTypeName(*it) + ", expected a file name");
      }
      const std::string& shard = it->get_ref<const std::string&>();
      if (!IsSafeShardName(shard)) {
        return DataLossError(index_path + ": weight_map entry for tensor " + Quote(it.key()) +
                             " names shard " + Quote(shard) +
                             ", which is not a relative path inside the model directory");
      }
      weight_map[it.key()] = shard;
      shard_names.insert(shard);
    }
    for (const std::string& shard : shard_names) shard_paths.push_back(JoinPath(path, shard));
  }

  SafetensorsModel model;
  model.shards_.reserve(shard_paths.size());
  for (const std::string& shard_path : shard_paths) {
    Result<SafetensorsFile> file = SafetensorsFile::Open(shard_path);
    if (!file.ok()) {
      if (!index_path.empty()) {
        return file.status().WithPrefix(index_path + ": shard named in weight_map");
      }
      return file.status();
    }
    model.shards_.push_back(std::move(*file));
    model.files_.push_back(shard_path);
  }

  for (size_t s = 0; s < model.shards_.size(); ++s) {
    const SafetensorsFile& shard = model.shards_[s];
    for (size_t t = 0; t < shard.tensors().size(); ++t) {
      const std::string& name = shard.tensors()[t].name;
      auto [it, inserted] = model.index_.emplace(name, std::make_pair(s, t));
      if (!inserted) {
        return DataLossError(shard.path() + ": tensor " + Quote(name) + " is also in " +
                             model.shards_[it->second.first].path() +
                             "; a tensor must live in exactly one shard");
      }
    }
    for (const auto& [key, value] : shard.metadata()) model.metadata_.emplace(key, value);
  }

  for (const auto& [name, shard] : weight_map) {
    const std::string expected = JoinPath(path, shard);
    auto it = model.index_.find(name);
    if (it == model.index_.end() || model.shards_[it->second.first].path() != expected) {
      return DataLossError(index_path + ": weight_map puts tensor " + Quote(name) + " in " +
                           Quote(shard) + " but that shard does not hold it");
    }
  }
  return model;
}

const TensorInfo* SafetensorsModel::Find(std::string_view name) const {
  auto it = index_.find(name);
  if (it == index_.end()) return nullptr;
  return &shards_[it->second.first].tensors()[it->second.second];
}

std::vector<const TensorInfo*> SafetensorsModel::tensors() const {
  std::vector<const TensorInfo*> out;
  out.reserve(index_.size());
  for (const auto& [name, where] : index_) {
    out.push_back(&shards_[where.first].tensors()[where.second]);
  }
  return out;
}

uint64_t SafetensorsModel::total_tensor_bytes() const {
  uint64_t total = 0;
  for (const SafetensorsFile& shard : shards_) {
    for (const TensorInfo& t : shard.tensors()) total += t.size_bytes;
  }
  return total;
}

// ---------------------------------------------------------------------------
// Conversions

uint16_t F32ToBF16(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  if ((bits & 0x7fffffffu) > 0x7f800000u) {
    // NaN: keep sign and top payload bits, force the quiet bit so the
    // result stays a NaN even when the payload was only in the low bits.
    return static_cast<uint16_t>((bits >> 16) | 0x0040u);
  }
  // Round to nearest, ties to even. Overflow carries into the exponent and
  // yields inf, which is the correctly rounded result.
  uint32_t rounding = 0x7fffu + ((bits >> 16) & 1u);
  return static_cast<uint16_t>((bits + rounding) >> 16);
}

float BF16ToF32(uint16_t h) {
  uint32_t bits = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

uint16_t F32ToF16(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  const uint32_t sign = (bits >> 16) & 0x8000u;
  const int32_t exp = static_cast<int32_t>((bits >> 23) & 0xffu);
  uint32_t mant = bits & 0x7fffffu;

  if (exp == 0xff) {  // inf or NaN
    if (mant == 0) return static_cast<uint16_t>(sign | 0x7c00u);
    return static_cast<uint16_t>(sign | 0x7e00u | (mant >> 13));
  }
  const int32_t e = exp - 127 + 15;  // f16 biased exponent
  if (e >= 31) return static_cast<uint16_t>(sign | 0x7c00u);  // overflow → inf
  if (e <= 0) {
    // f16 subnormal (or zero): value = mant' × 2^-24 with mant' = full
    // significand >> shift, rounded to nearest even.
    const int32_t shift = 14 - e;  // ≥ 14
    if (shift > 24) return static_cast<uint16_t>(sign);  // below half the smallest subnormal
    mant |= 0x800000u;
    uint32_t r = mant >> shift;
    const uint32_t rem = mant & ((1u << shift) - 1u);
    const uint32_t half = 1u << (shift - 1);
    if (rem > half || (rem == half && (r & 1u))) ++r;  // may carry into the smallest normal
    return static_cast<uint16_t>(sign | r);
  }
  uint32_t h = (static_cast<uint32_t>(e) << 10) | (mant >> 13);
  const uint32_t rem = mant & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) ++h;  // may carry to inf: correct
  return static_cast<uint16_t>(sign | h);
}

float F16ToF32(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu;
  const uint32_t mant = h & 0x3ffu;
  uint32_t bits;
  if (exp == 0) {
    if (mant == 0) {
      bits = sign;
    } else {
      // Subnormal: mant × 2^-24, exact in f32.
      float v = static_cast<float>(mant) * 0x1p-24f;
      return sign ? -v : v;
    }
  } else if (exp == 31) {
    bits = sign | 0x7f800000u | (mant << 13);
  } else {
    bits = sign | ((exp + 112u) << 23) | (mant << 13);
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

Status ConvertToF32(const TensorInfo& tensor, float* out) {
  const int64_t n = tensor.num_elements();
  const size_t elem = DTypeSize(tensor.dtype);
  if (n < 0 || static_cast<uint64_t>(n) * elem != tensor.size_bytes) {
    return InvalidArgumentError("tensor " + Quote(tensor.name) + ": size_bytes " +
                                std::to_string(tensor.size_bytes) + " does not match shape " +
                                ShapeString(tensor.shape));
  }
  const uint8_t* src = tensor.data;
  const size_t count = static_cast<size_t>(n);
  switch (tensor.dtype) {
    case DType::kF32:
      if (count > 0) std::memcpy(out, src, count * 4);
      return OkStatus();
    case DType::kBF16:
      for (size_t i = 0; i < count; ++i) {
        uint16_t h;
        std::memcpy(&h, src + 2 * i, 2);
        uint32_t bits = static_cast<uint32_t>(h) << 16;
        std::memcpy(&out[i], &bits, 4);
      }
      return OkStatus();
    case DType::kF16:
      for (size_t i = 0; i < count; ++i) {
        uint16_t h;
        std::memcpy(&h, src + 2 * i, 2);
        out[i] = F16ToF32(h);
      }
      return OkStatus();
    default:
      return UnimplementedError("tensor " + Quote(tensor.name) + " in " + tensor.file +
                                ": cannot convert dtype " + std::string(DTypeName(tensor.dtype)) +
                                " to F32 (supported: F32, F16, BF16)");
  }
}

// ---------------------------------------------------------------------------
// Writer

Status WriteSafetensors(const std::string& path, const std::vector<TensorToWrite>& tensors,
                        const std::map<std::string, std::string>& metadata) {
  std::string header_text;
  try {
    json header = json::object();
    if (!metadata.empty()) {
      json meta = json::object();
      for (const auto& [key, value] : metadata) meta[key] = value;
      header["__metadata__"] = std::move(meta);
    }
    uint64_t offset = 0;
    for (const TensorToWrite& t : tensors) {
      const std::string where = path + ": tensor " + Quote(t.name);
      if (t.name.empty()) return InvalidArgumentError(path + ": a tensor has an empty name");
      if (t.name == "__metadata__") {
        return InvalidArgumentError(where + ": the name is reserved for metadata");
      }
      if (header.contains(t.name)) {
        return InvalidArgumentError(where + ": the name appears twice");
      }
      if (DTypeSize(t.dtype) == 0) return InvalidArgumentError(where + ": invalid dtype");
      uint64_t need = 0;
      if (!ShapeBytes(t.shape, DTypeSize(t.dtype), &need)) {
        return InvalidArgumentError(where + ": shape " + ShapeString(t.shape) +
                                    " has a negative dimension or overflows");
      }
      if (need != t.data.size()) {
        return InvalidArgumentError(where + ": data holds " + std::to_string(t.data.size()) +
                                    " bytes but shape " + ShapeString(t.shape) + " of " +
                                    std::string(DTypeName(t.dtype)) + " needs " +
                                    std::to_string(need));
      }
      json entry = json::object();
      entry["dtype"] = std::string(DTypeName(t.dtype));
      entry["shape"] = t.shape;
      entry["data_offsets"] = {offset, offset + need};
      header[t.name] = std::move(entry);
      offset += need;
    }
    header_text = header.dump();
  } catch (const std::exception& e) {
    // dump() throws on names or metadata that are not valid UTF-8.
    return InvalidArgumentError(path + ": cannot encode the header: " + e.what());
  }
  // Pad with spaces so the data area starts 8-byte aligned.
  while (header_text.size() % 8 != 0) header_text.push_back(' ');
  if (header_text.size() > SafetensorsFile::kMaxHeaderBytes) {
    return InvalidArgumentError(path + ": header of " + std::to_string(header_text.size()) +
                                " bytes exceeds the 100 MiB limit");
  }

  return WriteFileAtomicStreaming(path, [&](const std::function<Status(const void*, size_t)>& append) {
    uint8_t length[8];
    uint64_t n = header_text.size();
    for (int i = 0; i < 8; ++i) length[i] = static_cast<uint8_t>(n >> (8 * i));
    ARBITER_RETURN_IF_ERROR(append(length, 8));
    ARBITER_RETURN_IF_ERROR(append(header_text.data(), header_text.size()));
    for (const TensorToWrite& t : tensors) {
      if (!t.data.empty()) ARBITER_RETURN_IF_ERROR(append(t.data.data(), t.data.size()));
    }
    return OkStatus();
  });
}

std::string ShapeString(const std::vector<int64_t>& shape) {
  std::string out = "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i > 0) out += ", ";
    out += std::to_string(shape[i]);
  }
  return out + "]";
}

}  // namespace arbiter
