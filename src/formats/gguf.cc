// GGUF reader and writer (arbiter/formats/gguf.h).
//
// Reading is "validate everything, then expose", as for safetensors: the
// parser walks the header, every metadata value and every tensor info with a
// cursor that never reads past the input, and returns a GgufFile only when
// all the checks listed in gguf.h hold.
//
// Note [Counts bounded by bytes]: every count in the file (tensors, metadata
// entries, array elements, string lengths) is compared with the bytes left
// before anything is reserved: an entry or element cannot take fewer bytes
// than its smallest encoding (a metadata entry 14: a 1-byte key with its u64
// length, a u32 type and a u8 value; a tensor info 33; a string 8; an array
// 12), so a count larger than remaining / smallest is corrupt. Memory is
// then at most a small multiple of the file's size: scalars and strings 1×,
// string end offsets 1× (8 bytes per 8-byte length), arrays inside arrays
// about 8× per 12-byte array header — which is why those are also capped at
// kMaxNestedArrays per file, and their depth at kMaxArrayDepth so recursion
// stays shallow.
//
// Note [Overlap check]: as in safetensors.cc — tensors sorted by offset; a
// tensor overlaps when it starts before the furthest end seen so far;
// zero-byte tensors occupy nothing and are skipped; holes are allowed.
//
// The host is not assumed little-endian: every integer is assembled from
// bytes, and array payloads are kept in the file's byte order and decoded on
// access.

#include "arbiter/formats/gguf.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <utility>

#include "arbiter/base/file.h"

namespace arbiter {
namespace {

constexpr char kMagic[4] = {'G', 'G', 'U', 'F'};
constexpr uint32_t kWriteVersion = 3;
// Smallest encodings (Note [Counts bounded by bytes]).
constexpr uint64_t kMinMetadataEntryBytes = 8 + 1 + 4 + 1;
constexpr uint64_t kMinTensorInfoBytes = 8 + 1 + 4 + 8 + 4 + 8;
constexpr uint64_t kStringHeaderBytes = 8;
constexpr uint64_t kArrayHeaderBytes = 4 + 8;
// Longest name or string quoted in a message.
constexpr size_t kMaxQuotedBytes = 120;

// Bytes of a scalar of `type`; 0 for string, array and unknown values.
size_t ScalarBytes(GgufValueType type) {
  switch (type) {
    case GgufValueType::kUint8:
    case GgufValueType::kInt8:
    case GgufValueType::kBool:
      return 1;
    case GgufValueType::kUint16:
    case GgufValueType::kInt16:
      return 2;
    case GgufValueType::kUint32:
    case GgufValueType::kInt32:
    case GgufValueType::kFloat32:
      return 4;
    case GgufValueType::kUint64:
    case GgufValueType::kInt64:
    case GgufValueType::kFloat64:
      return 8;
    case GgufValueType::kString:
    case GgufValueType::kArray:
      return 0;
  }
  return 0;
}

bool IsKnownType(uint32_t v) { return v <= static_cast<uint32_t>(GgufValueType::kFloat64); }

bool IsUnsignedType(GgufValueType t) {
  return t == GgufValueType::kUint8 || t == GgufValueType::kUint16 ||
         t == GgufValueType::kUint32 || t == GgufValueType::kUint64;
}

bool IsSignedType(GgufValueType t) {
  return t == GgufValueType::kInt8 || t == GgufValueType::kInt16 || t == GgufValueType::kInt32 ||
         t == GgufValueType::kInt64;
}

bool IsFloatType(GgufValueType t) {
  return t == GgufValueType::kFloat32 || t == GgufValueType::kFloat64;
}

uint64_t LoadLE(const char* p, size_t n) {
  uint64_t v = 0;
  for (size_t i = n; i > 0; --i) v = (v << 8) | static_cast<uint8_t>(p[i - 1]);
  return v;
}

void StoreLE(uint64_t v, size_t n, std::string* out) {
  for (size_t i = 0; i < n; ++i) out->push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

int64_t SignExtend(uint64_t bits, size_t n) {
  const int shift = static_cast<int>(64 - 8 * n);
  return static_cast<int64_t>(bits << shift) >> shift;
}

// "name" with control bytes, quotes and backslashes escaped, cut at
// kMaxQuotedBytes; for messages about names that come from the file.
std::string Quote(std::string_view s) {
  std::string out = "\"";
  const size_t n = std::min(s.size(), kMaxQuotedBytes);
  for (size_t i = 0; i < n; ++i) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    if (c == '"' || c == '\\') {
      out.push_back('\\');
      out.push_back(static_cast<char>(c));
    } else if (c < 0x20 || c == 0x7f) {
      static const char kHex[] = "0123456789abcdef";
      out += "\\x";
      out.push_back(kHex[c >> 4]);
      out.push_back(kHex[c & 15]);
    } else {
      out.push_back(static_cast<char>(c));
    }
  }
  out.push_back('"');
  if (n < s.size()) out += "... (" + std::to_string(s.size()) + " bytes)";
  return out;
}

// "u32", "array of string", "array of array".
std::string Describe(const GgufValue& v) {
  if (!v.is_array()) return std::string(GgufValueTypeName(v.type()));
  return "array of " + std::string(GgufValueTypeName(v.element_type()));
}

// "[4096, 32000]".
std::string DimsText(const std::vector<int64_t>& dims) {
  std::string s = "[";
  for (size_t i = 0; i < dims.size(); ++i) s += (i ? ", " : "") + std::to_string(dims[i]);
  return s + "]";
}

// Element count and bytes of a tensor of `dims` and `traits`, or the reason
// it has none (without a prefix).
bool TensorSize(const std::vector<int64_t>& dims, const GgmlTypeTraits& traits,
                int64_t* n_elements, uint64_t* size_bytes, std::string* why) {
  int64_t n = 1;
  for (int64_t d : dims) {
    if (d < 0) {
      *why = "dimension " + std::to_string(d) + " is negative";
      return false;
    }
    if (__builtin_mul_overflow(n, d, &n)) {
      *why = "the element count of dims " + DimsText(dims) + " overflows 64 bits";
      return false;
    }
  }
  if (dims.empty() || dims[0] % traits.block_elems != 0) {
    *why = "row length dims[0] = " + (dims.empty() ? std::string("?") : std::to_string(dims[0])) +
           " is not a multiple of " + std::string(traits.name) + "'s block of " +
           std::to_string(traits.block_elems) + " elements";
    return false;
  }
  // n / dims[0] rows of dims[0] / block_elems blocks each; with a zero
  // dimension there are no bytes at all.
  uint64_t bytes = 0;
  if (n > 0) {
    const uint64_t rows = static_cast<uint64_t>(n / dims[0]);
    const uint64_t blocks = static_cast<uint64_t>(dims[0] / traits.block_elems);
    uint64_t row_bytes = 0;
    if (__builtin_mul_overflow(blocks, uint64_t{traits.block_bytes}, &row_bytes) ||
        __builtin_mul_overflow(rows, row_bytes, &bytes)) {
      *why = "the byte size of " + std::to_string(n) + " " + std::string(traits.name) +
             " elements overflows 64 bits";
      return false;
    }
  }
  *n_elements = n;
  *size_bytes = bytes;
  return true;
}

uint64_t AlignUp(uint64_t v, uint64_t alignment) {
  // alignment is a power of two ≤ 2^31 and v ≤ the input size, so this
  // cannot overflow.
  return (v + alignment - 1) & ~(alignment - 1);
}

int ArrayDepth(const GgufValue& v) {
  if (!v.is_array()) return 0;
  int deepest = 0;
  if (v.element_type() == GgufValueType::kArray) {
    for (size_t i = 0; i < v.size(); ++i) deepest = std::max(deepest, ArrayDepth(v.ArrayAt(i)));
  }
  return 1 + deepest;
}

}  // namespace

std::string_view GgufValueTypeName(GgufValueType type) {
  switch (type) {
    case GgufValueType::kUint8: return "u8";
    case GgufValueType::kInt8: return "i8";
    case GgufValueType::kUint16: return "u16";
    case GgufValueType::kInt16: return "i16";
    case GgufValueType::kUint32: return "u32";
    case GgufValueType::kInt32: return "i32";
    case GgufValueType::kFloat32: return "f32";
    case GgufValueType::kBool: return "bool";
    case GgufValueType::kString: return "string";
    case GgufValueType::kArray: return "array";
    case GgufValueType::kUint64: return "u64";
    case GgufValueType::kInt64: return "i64";
    case GgufValueType::kFloat64: return "f64";
  }
  return "type ?";
}

// ---------------------------------------------------------------------------
// GgufValue

#define ARBITER_GGUF_SCALAR(Name, CType, Type, ToBits)                      \
  GgufValue GgufValue::Name(CType v) {                                     \
    GgufValue out;                                                         \
    out.type_ = GgufValueType::Type;                                       \
    out.bits_ = ToBits;                                                    \
    return out;                                                            \
  }
ARBITER_GGUF_SCALAR(Uint8, uint8_t, kUint8, v)
ARBITER_GGUF_SCALAR(Int8, int8_t, kInt8, static_cast<uint8_t>(v))
ARBITER_GGUF_SCALAR(Uint16, uint16_t, kUint16, v)
ARBITER_GGUF_SCALAR(Int16, int16_t, kInt16, static_cast<uint16_t>(v))
ARBITER_GGUF_SCALAR(Uint32, uint32_t, kUint32, v)
ARBITER_GGUF_SCALAR(Int32, int32_t, kInt32, static_cast<uint32_t>(v))
ARBITER_GGUF_SCALAR(Bool, bool, kBool, v ? 1u : 0u)
ARBITER_GGUF_SCALAR(Uint64, uint64_t, kUint64, v)
ARBITER_GGUF_SCALAR(Int64, int64_t, kInt64, static_cast<uint64_t>(v))
#undef ARBITER_GGUF_SCALAR

GgufValue GgufValue::Float32(float v) {
  uint32_t bits;
  std::memcpy(&bits, &v, 4);
  GgufValue out;
  out.type_ = GgufValueType::kFloat32;
  out.bits_ = bits;
  return out;
}

GgufValue GgufValue::Float64(double v) {
  GgufValue out;
  out.type_ = GgufValueType::kFloat64;
  std::memcpy(&out.bits_, &v, 8);
  return out;
}

GgufValue GgufValue::String(std::string_view v) {
  GgufValue out;
  out.type_ = GgufValueType::kString;
  out.bytes_.assign(v.data(), v.size());
  return out;
}

GgufValue GgufValue::StringArray(const std::vector<std::string>& items) {
  GgufValue out;
  out.type_ = GgufValueType::kArray;
  out.element_type_ = GgufValueType::kString;
  out.count_ = items.size();
  size_t total = 0;
  for (const std::string& s : items) total += s.size();
  out.bytes_.reserve(total);
  out.ends_.reserve(items.size());
  for (const std::string& s : items) {
    out.bytes_ += s;
    out.ends_.push_back(out.bytes_.size());
  }
  return out;
}

Result<GgufValue> GgufValue::IntArray(GgufValueType element_type,
                                      const std::vector<int64_t>& items) {
  if (!IsUnsignedType(element_type) && !IsSignedType(element_type)) {
    return InvalidArgumentError("IntArray: element type " +
                                std::string(GgufValueTypeName(element_type)) +
                                " is not an integer type");
  }
  const size_t size = ScalarBytes(element_type);
  GgufValue out;
  out.type_ = GgufValueType::kArray;
  out.element_type_ = element_type;
  out.count_ = items.size();
  out.bytes_.reserve(items.size() * size);
  for (size_t i = 0; i < items.size(); ++i) {
    const int64_t v = items[i];
    bool fits;
    if (IsUnsignedType(element_type)) {
      fits = v >= 0 && (size == 8 || static_cast<uint64_t>(v) < (uint64_t{1} << (8 * size)));
    } else {
      fits = size == 8 || (v >= -(int64_t{1} << (8 * size - 1)) && v < (int64_t{1} << (8 * size - 1)));
    }
    if (!fits) {
      return InvalidArgumentError("IntArray: element " + std::to_string(i) + " = " +
                                  std::to_string(v) + " does not fit " +
                                  std::string(GgufValueTypeName(element_type)));
    }
    StoreLE(static_cast<uint64_t>(v), size, &out.bytes_);
  }
  return out;
}

Result<GgufValue> GgufValue::FloatArray(GgufValueType element_type,
                                        const std::vector<double>& items) {
  if (!IsFloatType(element_type)) {
    return InvalidArgumentError("FloatArray: element type " +
                                std::string(GgufValueTypeName(element_type)) +
                                " is not f32 or f64");
  }
  GgufValue out;
  out.type_ = GgufValueType::kArray;
  out.element_type_ = element_type;
  out.count_ = items.size();
  out.bytes_.reserve(items.size() * ScalarBytes(element_type));
  for (double d : items) {
    if (element_type == GgufValueType::kFloat32) {
      const float f = static_cast<float>(d);
      uint32_t bits;
      std::memcpy(&bits, &f, 4);
      StoreLE(bits, 4, &out.bytes_);
    } else {
      uint64_t bits;
      std::memcpy(&bits, &d, 8);
      StoreLE(bits, 8, &out.bytes_);
    }
  }
  return out;
}

GgufValue GgufValue::BoolArray(const std::vector<bool>& items) {
  GgufValue out;
  out.type_ = GgufValueType::kArray;
  out.element_type_ = GgufValueType::kBool;
  out.count_ = items.size();
  for (bool b : items) out.bytes_.push_back(b ? 1 : 0);
  return out;
}

Result<GgufValue> GgufValue::ArrayOfArrays(std::vector<GgufValue> items) {
  for (size_t i = 0; i < items.size(); ++i) {
    if (!items[i].is_array()) {
      return InvalidArgumentError("ArrayOfArrays: element " + std::to_string(i) + " is " +
                                  Describe(items[i]) + ", not an array");
    }
  }
  GgufValue out;
  out.type_ = GgufValueType::kArray;
  out.element_type_ = GgufValueType::kArray;
  out.count_ = items.size();
  out.arrays_ = std::move(items);
  return out;
}

std::optional<uint64_t> GgufValue::AsUint() const {
  if (IsUnsignedType(type_)) return bits_;
  if (IsSignedType(type_)) {
    const int64_t v = SignExtend(bits_, ScalarBytes(type_));
    if (v >= 0) return static_cast<uint64_t>(v);
  }
  return std::nullopt;
}

std::optional<int64_t> GgufValue::AsInt() const {
  if (IsSignedType(type_)) return SignExtend(bits_, ScalarBytes(type_));
  if (IsUnsignedType(type_) && bits_ <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
    return static_cast<int64_t>(bits_);
  }
  return std::nullopt;
}

std::optional<double> GgufValue::AsFloat() const {
  if (type_ == GgufValueType::kFloat32) {
    const uint32_t bits = static_cast<uint32_t>(bits_);
    float f;
    std::memcpy(&f, &bits, 4);
    return static_cast<double>(f);
  }
  if (type_ == GgufValueType::kFloat64) {
    double d;
    std::memcpy(&d, &bits_, 8);
    return d;
  }
  return std::nullopt;
}

std::optional<bool> GgufValue::AsBool() const {
  if (type_ != GgufValueType::kBool) return std::nullopt;
  return bits_ != 0;
}

std::optional<std::string_view> GgufValue::AsString() const {
  if (type_ != GgufValueType::kString) return std::nullopt;
  return std::string_view(bytes_);
}

GgufValue GgufValue::At(size_t i) const {
  if (!is_array() || i >= count_) return GgufValue();
  switch (element_type_) {
    case GgufValueType::kString:
      return String(StringAt(i));
    case GgufValueType::kArray:
      return arrays_[i];
    default: {
      const size_t n = ScalarBytes(element_type_);
      GgufValue v;
      v.type_ = element_type_;
      v.bits_ = LoadLE(bytes_.data() + i * n, n);
      return v;
    }
  }
}

std::string_view GgufValue::StringAt(size_t i) const {
  if (!is_array() || element_type_ != GgufValueType::kString || i >= count_) return {};
  const uint64_t begin = i == 0 ? 0 : ends_[i - 1];
  return std::string_view(bytes_).substr(begin, ends_[i] - begin);
}

const GgufValue& GgufValue::ArrayAt(size_t i) const {
  static const GgufValue* const kEmpty = [] {
    auto* v = new GgufValue();
    v->type_ = GgufValueType::kArray;
    return v;
  }();
  if (!is_array() || element_type_ != GgufValueType::kArray || i >= count_) return *kEmpty;
  return arrays_[i];
}

bool operator==(const GgufValue& a, const GgufValue& b) {
  return a.type_ == b.type_ && a.element_type_ == b.element_type_ && a.bits_ == b.bits_ &&
         a.count_ == b.count_ && a.bytes_ == b.bytes_ && a.ends_ == b.ends_ &&
         a.arrays_ == b.arrays_;
}

std::vector<int64_t> GgufTensorInfo::RowMajorShape() const {
  return std::vector<int64_t>(dims.rbegin(), dims.rend());
}

// ---------------------------------------------------------------------------
// Parser

// Walks one GGUF image. Every Read* returns a Status whose message has no
// file prefix; Parse() adds "<name>: key \"k\"" or "<name>: tensor \"t\"".
class GgufParser {
 public:
  GgufParser(std::string_view bytes, const std::string& name) : bytes_(bytes), name_(name) {}

  Result<GgufFile> Parse();

 private:
  size_t remaining() const { return bytes_.size() - pos_; }

  // `what` (e.g. "value") needs `n` bytes at pos_.
  Status Truncated(std::string_view what, uint64_t n) const {
    return DataLossError(std::string(what) + " truncated: needs " + std::to_string(n) +
                         " bytes at byte " + std::to_string(pos_) + ", the " +
                         std::to_string(bytes_.size()) + "-byte file has " +
                         std::to_string(remaining()));
  }

  Status ReadUint(std::string_view what, size_t n, uint64_t* v) {
    if (remaining() < n) return Truncated(what, n);
    *v = LoadLE(bytes_.data() + pos_, n);
    pos_ += n;
    return OkStatus();
  }

  // A u64 length then that many bytes, the length within [min_len, max_len].
  Status ReadString(std::string_view what, uint64_t min_len, uint64_t max_len, std::string* out) {
    uint64_t len = 0;
    ARBITER_RETURN_IF_ERROR(ReadUint(std::string(what) + " length", 8, &len));
    if (len < min_len || len > max_len) {
      return DataLossError(std::string(what) + " length " + std::to_string(len) + " at byte " +
                           std::to_string(pos_ - 8) + " is outside 1.." + std::to_string(max_len));
    }
    if (len > remaining()) return Truncated(what, len);
    out->assign(bytes_.data() + pos_, len);
    pos_ += len;
    return OkStatus();
  }

  Status ReadValue(GgufValueType type, int depth, GgufValue* out);
  Status ReadArray(int depth, GgufValue* out);

  std::string_view bytes_;
  const std::string& name_;
  size_t pos_ = 0;
  uint64_t nested_arrays_ = 0;
};

Status GgufParser::ReadValue(GgufValueType type, int depth, GgufValue* out) {
  out->type_ = type;
  if (type == GgufValueType::kString) {
    uint64_t len = 0;
    ARBITER_RETURN_IF_ERROR(ReadUint("string length", 8, &len));
    if (len > remaining()) return Truncated("string", len);
    out->bytes_.assign(bytes_.data() + pos_, len);
    pos_ += len;
    return OkStatus();
  }
  if (type == GgufValueType::kArray) return ReadArray(depth + 1, out);
  const size_t n = ScalarBytes(type);
  ARBITER_RETURN_IF_ERROR(ReadUint("value", n, &out->bits_));
  if (type == GgufValueType::kBool && out->bits_ > 1) {
    return DataLossError("bool at byte " + std::to_string(pos_ - 1) + " is " +
                         std::to_string(out->bits_) + "; bools are 0 or 1");
  }
  return OkStatus();
}

Status GgufParser::ReadArray(int depth, GgufValue* out) {
  if (depth > GgufFile::kMaxArrayDepth) {
    return DataLossError("arrays nested deeper than " + std::to_string(GgufFile::kMaxArrayDepth) +
                         " levels at byte " + std::to_string(pos_));
  }
  const size_t header_pos = pos_;
  uint64_t element_type = 0, count = 0;
  ARBITER_RETURN_IF_ERROR(ReadUint("array element type", 4, &element_type));
  ARBITER_RETURN_IF_ERROR(ReadUint("array count", 8, &count));
  if (!IsKnownType(static_cast<uint32_t>(element_type))) {
    return DataLossError("array at byte " + std::to_string(header_pos) +
                         " has unknown element type " + std::to_string(element_type) +
                         " (known: 0..12)");
  }
  const GgufValueType et = static_cast<GgufValueType>(element_type);
  out->type_ = GgufValueType::kArray;
  out->element_type_ = et;
  const uint64_t min_bytes = et == GgufValueType::kString  ? kStringHeaderBytes
                             : et == GgufValueType::kArray ? kArrayHeaderBytes
                                                           : ScalarBytes(et);
  // Note [Counts bounded by bytes].
  if (count > remaining() / min_bytes) {
    return DataLossError("array at byte " + std::to_string(header_pos) + " claims " +
                         std::to_string(count) + " " + std::string(GgufValueTypeName(et)) +
                         " elements, at least " + std::to_string(min_bytes) +
                         " bytes each, but only " + std::to_string(remaining()) +
                         " bytes are left; the file is truncated or corrupt");
  }
  out->count_ = count;
  switch (et) {
    case GgufValueType::kString: {
      // Two passes: measure, then copy into one buffer.
      const size_t start = pos_;
      uint64_t total = 0;
      for (uint64_t i = 0; i < count; ++i) {
        uint64_t len = 0;
        ARBITER_RETURN_IF_ERROR(ReadUint("string length", 8, &len));
        if (len > remaining()) {
          return Truncated("string " + std::to_string(i) + " of the array", len);
        }
        pos_ += len;
        total += len;
      }
      pos_ = start;
      out->bytes_.reserve(total);
      out->ends_.reserve(count);
      for (uint64_t i = 0; i < count; ++i) {
        const uint64_t len = LoadLE(bytes_.data() + pos_, 8);
        pos_ += 8;
        out->bytes_.append(bytes_.data() + pos_, len);
        pos_ += len;
        out->ends_.push_back(out->bytes_.size());
      }
      return OkStatus();
    }
    case GgufValueType::kArray: {
      if (count > GgufFile::kMaxNestedArrays - nested_arrays_) {
        return DataLossError("more than " + std::to_string(GgufFile::kMaxNestedArrays) +
                             " arrays inside arrays (array at byte " + std::to_string(header_pos) +
                             ")");
      }
      nested_arrays_ += count;
      out->arrays_.resize(count);
      for (uint64_t i = 0; i < count; ++i) {
        ARBITER_RETURN_IF_ERROR(ReadArray(depth + 1, &out->arrays_[i]));
      }
      return OkStatus();
    }
    default: {
      const size_t n = static_cast<size_t>(count * min_bytes);  // ≤ remaining()
      out->bytes_.assign(bytes_.data() + pos_, n);
      if (et == GgufValueType::kBool) {
        for (size_t i = 0; i < n; ++i) {
          if (static_cast<uint8_t>(out->bytes_[i]) > 1) {
            return DataLossError("bool at byte " + std::to_string(pos_ + i) + " (element " +
                                 std::to_string(i) + " of the array) is " +
                                 std::to_string(static_cast<uint8_t>(out->bytes_[i])) +
                                 "; bools are 0 or 1");
          }
        }
      }
      pos_ += n;
      return OkStatus();
    }
  }
}

Result<GgufFile> GgufParser::Parse() {
  GgufFile file;
  file.name_ = name_;
  file.file_size_ = bytes_.size();
  const std::string& n = name_;

  if (bytes_.size() < 4) {
    return DataLossError(n + ": file is " + std::to_string(bytes_.size()) +
                         " bytes, too short for the GGUF magic; it is truncated or not a GGUF file");
  }
  if (std::memcmp(bytes_.data(), kMagic, 4) != 0) {
    return DataLossError(n + ": not a GGUF file: it starts with " + Quote(bytes_.substr(0, 4)) +
                         ", expected \"GGUF\"");
  }
  pos_ = 4;
  uint64_t version = 0, tensor_count = 0, kv_count = 0;
  if (Status s = ReadUint("header", 4, &version); !s.ok()) return s.WithPrefix(n);
  if (version == 1) {
    return UnimplementedError(n + ": GGUF version 1 (the 2023 draft with 32-bit counts) is not "
                              "supported; convert the model again with a current llama.cpp");
  }
  if (version == 0x02000000u || version == 0x03000000u) {
    return UnimplementedError(n + ": big-endian GGUF file (its version reads " +
                              std::to_string(version) +
                              " little-endian); only little-endian files are supported");
  }
  if (version != 2 && version != 3) {
    return UnimplementedError(n + ": GGUF version " + std::to_string(version) +
                              " is not supported (supported: 2, 3)");
  }
  file.version_ = static_cast<uint32_t>(version);
  if (Status s = ReadUint("header", 8, &tensor_count); !s.ok()) return s.WithPrefix(n);
  if (Status s = ReadUint("header", 8, &kv_count); !s.ok()) return s.WithPrefix(n);
  // Note [Counts bounded by bytes].
  if (kv_count > remaining() / kMinMetadataEntryBytes ||
      tensor_count > remaining() / kMinTensorInfoBytes ||
      kv_count * kMinMetadataEntryBytes + tensor_count * kMinTensorInfoBytes > remaining()) {
    return DataLossError(n + ": header claims " + std::to_string(kv_count) +
                         " metadata entries and " + std::to_string(tensor_count) +
                         " tensors, more than the " + std::to_string(remaining()) +
                         " bytes after the header can hold; the file is truncated or corrupt");
  }

  // Metadata.
  file.metadata_.resize(kv_count);
  for (uint64_t i = 0; i < kv_count; ++i) {
    GgufMetadataEntry& e = file.metadata_[i];
    const std::string entry = "metadata entry " + std::to_string(i) + " of " +
                              std::to_string(kv_count);
    if (Status s = ReadString("key", 1, GgufFile::kMaxKeyBytes, &e.key); !s.ok()) {
      return s.WithPrefix(n + ": " + entry);
    }
    const std::string where = n + ": key " + Quote(e.key);
    uint64_t type = 0;
    if (Status s = ReadUint("value type", 4, &type); !s.ok()) return s.WithPrefix(where);
    if (!IsKnownType(static_cast<uint32_t>(type))) {
      return DataLossError(where + ": unknown value type " + std::to_string(type) +
                           " at byte " + std::to_string(pos_ - 4) + " (known: 0..12)");
    }
    if (Status s = ReadValue(static_cast<GgufValueType>(type), 0, &e.value); !s.ok()) {
      return s.WithPrefix(where);
    }
  }
  file.keys_sorted_.resize(kv_count);
  for (uint32_t i = 0; i < kv_count; ++i) file.keys_sorted_[i] = i;
  std::stable_sort(file.keys_sorted_.begin(), file.keys_sorted_.end(), [&](uint32_t a, uint32_t b) {
    return file.metadata_[a].key < file.metadata_[b].key;
  });
  for (size_t i = 1; i < file.keys_sorted_.size(); ++i) {
    const uint32_t a = file.keys_sorted_[i - 1], b = file.keys_sorted_[i];
    if (file.metadata_[a].key == file.metadata_[b].key) {
      return DataLossError(n + ": key " + Quote(file.metadata_[b].key) +
                           ": appears twice (metadata entries " + std::to_string(a) + " and " +
                           std::to_string(b) + ")");
    }
  }
  if (const GgufValue* v = file.FindValue("general.alignment")) {
    const std::string where = n + ": key \"general.alignment\"";
    if (v->type() != GgufValueType::kUint32) {
      return DataLossError(where + ": is " + Describe(*v) + ", expected u32");
    }
    const uint64_t a = *v->AsUint();
    if (a == 0 || (a & (a - 1)) != 0) {
      return DataLossError(where + ": " + std::to_string(a) + " is not a power of two");
    }
    file.alignment_ = a;
  }

  // Tensor infos.
  file.tensors_.resize(tensor_count);
  for (uint64_t i = 0; i < tensor_count; ++i) {
    GgufTensorInfo& t = file.tensors_[i];
    const std::string entry = "tensor info " + std::to_string(i) + " of " +
                              std::to_string(tensor_count);
    if (Status s = ReadString("name", 1, GgufFile::kMaxTensorNameBytes, &t.name); !s.ok()) {
      return s.WithPrefix(n + ": " + entry);
    }
    const std::string where = n + ": tensor " + Quote(t.name);
    uint64_t n_dims = 0;
    if (Status s = ReadUint("n_dims", 4, &n_dims); !s.ok()) return s.WithPrefix(where);
    if (n_dims < 1 || n_dims > static_cast<uint64_t>(GgufFile::kMaxDims)) {
      return DataLossError(where + ": n_dims " + std::to_string(n_dims) + " at byte " +
                           std::to_string(pos_ - 4) + " is outside 1.." +
                           std::to_string(GgufFile::kMaxDims));
    }
    t.dims.resize(n_dims);
    for (uint64_t d = 0; d < n_dims; ++d) {
      uint64_t dim = 0;
      if (Status s = ReadUint("dims", 8, &dim); !s.ok()) return s.WithPrefix(where);
      if (dim > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
        return DataLossError(where + ": dims[" + std::to_string(d) + "] = " + std::to_string(dim) +
                             " exceeds 2^63 - 1");
      }
      t.dims[d] = static_cast<int64_t>(dim);
    }
    uint64_t type = 0;
    if (Status s = ReadUint("type", 4, &type); !s.ok()) return s.WithPrefix(where);
    if (Status s = ReadUint("offset", 8, &t.offset); !s.ok()) return s.WithPrefix(where);
    std::optional<GgmlTypeTraits> traits = GgmlTypeTraitsOf(static_cast<uint32_t>(type));
    if (!traits) {
      return UnimplementedError(where + ": ggml type " + std::to_string(type) +
                                " is not a type this reader knows (see ggml_type.h)");
    }
    t.type = static_cast<GgmlType>(type);
    std::string why;
    if (!TensorSize(t.dims, *traits, &t.n_elements, &t.size_bytes, &why)) {
      return DataLossError(where + ": " + why);
    }
  }
  file.tensors_sorted_.resize(tensor_count);
  for (uint32_t i = 0; i < tensor_count; ++i) file.tensors_sorted_[i] = i;
  std::stable_sort(file.tensors_sorted_.begin(), file.tensors_sorted_.end(),
                   [&](uint32_t a, uint32_t b) { return file.tensors_[a].name < file.tensors_[b].name; });
  for (size_t i = 1; i < file.tensors_sorted_.size(); ++i) {
    const uint32_t a = file.tensors_sorted_[i - 1], b = file.tensors_sorted_[i];
    if (file.tensors_[a].name == file.tensors_[b].name) {
      return DataLossError(n + ": tensor " + Quote(file.tensors_[b].name) +
                           ": appears twice (tensor infos " + std::to_string(a) + " and " +
                           std::to_string(b) + ")");
    }
  }

  // Data section.
  file.data_offset_ = AlignUp(pos_, file.alignment_);
  if (tensor_count > 0 && file.data_offset_ > bytes_.size()) {
    return DataLossError(n + ": the data section would start at byte " +
                         std::to_string(file.data_offset_) + " (the tensor infos end at byte " +
                         std::to_string(pos_) + ", alignment " + std::to_string(file.alignment_) +
                         "), past the end of the " + std::to_string(bytes_.size()) +
                         "-byte file; the file is truncated");
  }
  const uint64_t data_bytes = tensor_count > 0 ? bytes_.size() - file.data_offset_ : 0;
  for (const GgufTensorInfo& t : file.tensors_) {
    const std::string where = n + ": tensor " + Quote(t.name);
    if (t.offset % file.alignment_ != 0) {
      return DataLossError(where + ": offset " + std::to_string(t.offset) +
                           " is not a multiple of the alignment " +
                           std::to_string(file.alignment_));
    }
    if (t.offset > data_bytes || t.size_bytes > data_bytes - t.offset) {
      return DataLossError(where + ": bytes [" + std::to_string(t.offset) + ", +" +
                           std::to_string(t.size_bytes) + ") of the data section end past the " +
                           std::to_string(data_bytes) + " bytes it has (the file is " +
                           std::to_string(bytes_.size()) + " bytes, data from byte " +
                           std::to_string(file.data_offset_) + "); the file is truncated or corrupt");
    }
  }
  // Note [Overlap check].
  std::vector<const GgufTensorInfo*> by_offset;
  by_offset.reserve(file.tensors_.size());
  for (const GgufTensorInfo& t : file.tensors_) {
    if (t.size_bytes > 0) by_offset.push_back(&t);
  }
  std::sort(by_offset.begin(), by_offset.end(),
            [](const GgufTensorInfo* a, const GgufTensorInfo* b) { return a->offset < b->offset; });
  const GgufTensorInfo* furthest = nullptr;
  for (const GgufTensorInfo* t : by_offset) {
    if (furthest != nullptr && t->offset < furthest->offset + furthest->size_bytes) {
      return DataLossError(n + ": tensor " + Quote(t->name) + " (data bytes [" +
                           std::to_string(t->offset) + ", " +
                           std::to_string(t->offset + t->size_bytes) + ")) overlaps tensor " +
                           Quote(furthest->name) + " (data bytes [" +
                           std::to_string(furthest->offset) + ", " +
                           std::to_string(furthest->offset + furthest->size_bytes) + "))");
    }
    if (furthest == nullptr ||
        t->offset + t->size_bytes > furthest->offset + furthest->size_bytes) {
      furthest = t;
    }
  }
  return file;
}

Result<GgufFile> ParseGguf(std::string_view bytes, const std::string& name) {
  return GgufParser(bytes, name).Parse();
}

Result<GgufFile> OpenGguf(const std::string& path) {
  Result<MappedFile> mapped = MappedFile::Open(path);
  if (!mapped.ok()) return mapped.status();
  return ParseGguf(std::string_view(reinterpret_cast<const char*>(mapped->data()), mapped->size()),
                   path);
  // The mapping is released here; the GgufFile holds copies.
}

// ---------------------------------------------------------------------------
// GgufFile lookups

const GgufValue* GgufFile::FindValue(std::string_view key) const {
  auto it = std::lower_bound(keys_sorted_.begin(), keys_sorted_.end(), key,
                             [&](uint32_t i, std::string_view k) { return metadata_[i].key < k; });
  if (it == keys_sorted_.end() || metadata_[*it].key != key) return nullptr;
  return &metadata_[*it].value;
}

const GgufTensorInfo* GgufFile::FindTensor(std::string_view name) const {
  auto it = std::lower_bound(tensors_sorted_.begin(), tensors_sorted_.end(), name,
                             [&](uint32_t i, std::string_view k) { return tensors_[i].name < k; });
  if (it == tensors_sorted_.end() || tensors_[*it].name != name) return nullptr;
  return &tensors_[*it];
}

namespace {

// The value of `key` in `file`, or kNotFound.
Result<const GgufValue*> Lookup(const GgufFile& file, std::string_view key) {
  const GgufValue* v = file.FindValue(key);
  if (v == nullptr) return NotFoundError(file.name() + ": key " + Quote(key) + ": is missing");
  return v;
}

Status WrongType(const GgufFile& file, std::string_view key, const GgufValue& v,
                 std::string_view expected) {
  return DataLossError(file.name() + ": key " + Quote(key) + ": is " + Describe(v) +
                       ", expected " + std::string(expected));
}

// "-5" / "18446744073709551615" for an integer value.
std::string IntText(const GgufValue& v) {
  if (std::optional<int64_t> i = v.AsInt()) return std::to_string(*i);
  if (std::optional<uint64_t> u = v.AsUint()) return std::to_string(*u);
  return "?";
}

}  // namespace

Result<std::string> GgufFile::GetString(std::string_view key) const {
  ARBITER_ASSIGN_OR_RETURN(const GgufValue* v, Lookup(*this, key));
  std::optional<std::string_view> s = v->AsString();
  if (!s) return WrongType(*this, key, *v, "a string");
  return std::string(*s);
}

Result<uint64_t> GgufFile::GetUint(std::string_view key) const {
  ARBITER_ASSIGN_OR_RETURN(const GgufValue* v, Lookup(*this, key));
  if (std::optional<uint64_t> u = v->AsUint()) return *u;
  if (IsSignedType(v->type())) {
    return DataLossError(name_ + ": key " + Quote(key) + ": is " + Describe(*v) + " " +
                         IntText(*v) + ", expected a non-negative integer");
  }
  return WrongType(*this, key, *v, "an integer");
}

Result<int64_t> GgufFile::GetInt(std::string_view key) const {
  ARBITER_ASSIGN_OR_RETURN(const GgufValue* v, Lookup(*this, key));
  if (std::optional<int64_t> i = v->AsInt()) return *i;
  if (IsUnsignedType(v->type())) {
    return DataLossError(name_ + ": key " + Quote(key) + ": is " + Describe(*v) + " " +
                         IntText(*v) + ", which does not fit int64");
  }
  return WrongType(*this, key, *v, "an integer");
}

Result<double> GgufFile::GetFloat(std::string_view key) const {
  ARBITER_ASSIGN_OR_RETURN(const GgufValue* v, Lookup(*this, key));
  if (std::optional<double> d = v->AsFloat()) return *d;
  return WrongType(*this, key, *v, "f32 or f64");
}

Result<bool> GgufFile::GetBool(std::string_view key) const {
  ARBITER_ASSIGN_OR_RETURN(const GgufValue* v, Lookup(*this, key));
  if (std::optional<bool> b = v->AsBool()) return *b;
  return WrongType(*this, key, *v, "bool");
}

Result<std::vector<std::string>> GgufFile::GetStringArray(std::string_view key) const {
  ARBITER_ASSIGN_OR_RETURN(const GgufValue* v, Lookup(*this, key));
  if (!v->is_array() || v->element_type() != GgufValueType::kString) {
    return WrongType(*this, key, *v, "an array of string");
  }
  std::vector<std::string> out;
  out.reserve(v->size());
  for (size_t i = 0; i < v->size(); ++i) out.emplace_back(v->StringAt(i));
  return out;
}

Result<std::vector<int64_t>> GgufFile::GetIntArray(std::string_view key) const {
  ARBITER_ASSIGN_OR_RETURN(const GgufValue* v, Lookup(*this, key));
  if (!v->is_array() ||
      (!IsUnsignedType(v->element_type()) && !IsSignedType(v->element_type()))) {
    return WrongType(*this, key, *v, "an array of integers");
  }
  std::vector<int64_t> out;
  out.reserve(v->size());
  for (size_t i = 0; i < v->size(); ++i) {
    std::optional<int64_t> x = v->At(i).AsInt();
    if (!x) {
      return DataLossError(name_ + ": key " + Quote(key) + ": element " + std::to_string(i) +
                           " is " + IntText(v->At(i)) + ", which does not fit int64");
    }
    out.push_back(*x);
  }
  return out;
}

Result<std::vector<double>> GgufFile::GetFloatArray(std::string_view key) const {
  ARBITER_ASSIGN_OR_RETURN(const GgufValue* v, Lookup(*this, key));
  if (!v->is_array() || !IsFloatType(v->element_type())) {
    return WrongType(*this, key, *v, "an array of f32 or f64");
  }
  std::vector<double> out;
  out.reserve(v->size());
  for (size_t i = 0; i < v->size(); ++i) out.push_back(*v->At(i).AsFloat());
  return out;
}

// ---------------------------------------------------------------------------
// Writer

Status GgufWriter::Add(std::string key, GgufValue value) {
  if (key.empty() || key.size() > GgufFile::kMaxKeyBytes) {
    return InvalidArgumentError("GGUF key " + Quote(key) + ": length " +
                                std::to_string(key.size()) + " is outside 1.." +
                                std::to_string(GgufFile::kMaxKeyBytes));
  }
  if (keys_.count(key) != 0) {
    return InvalidArgumentError("GGUF key " + Quote(key) + ": added twice");
  }
  if (ArrayDepth(value) > GgufFile::kMaxArrayDepth) {
    return InvalidArgumentError("GGUF key " + Quote(key) + ": arrays nested deeper than " +
                                std::to_string(GgufFile::kMaxArrayDepth) + " levels");
  }
  if (key == "general.alignment") {
    const uint64_t a = value.type() == GgufValueType::kUint32 ? *value.AsUint() : 0;
    if (a == 0 || (a & (a - 1)) != 0) {
      return InvalidArgumentError("GGUF key \"general.alignment\": must be a u32 power of two, got " +
                                  Describe(value));
    }
    alignment_ = a;
  }
  keys_.emplace(key, metadata_.size());
  metadata_.push_back(GgufMetadataEntry{std::move(key), std::move(value)});
  return OkStatus();
}

Status GgufWriter::AddString(std::string key, std::string_view value) {
  return Add(std::move(key), GgufValue::String(value));
}
Status GgufWriter::AddUint32(std::string key, uint32_t value) {
  return Add(std::move(key), GgufValue::Uint32(value));
}
Status GgufWriter::AddFloat32(std::string key, float value) {
  return Add(std::move(key), GgufValue::Float32(value));
}
Status GgufWriter::AddBool(std::string key, bool value) {
  return Add(std::move(key), GgufValue::Bool(value));
}
Status GgufWriter::AddStringArray(std::string key, const std::vector<std::string>& items) {
  return Add(std::move(key), GgufValue::StringArray(items));
}

Status GgufWriter::AddTensor(std::string name, std::vector<int64_t> dims, GgmlType type,
                             std::string_view data) {
  const std::string where = "GGUF tensor " + Quote(name);
  if (name.empty() || name.size() > GgufFile::kMaxTensorNameBytes) {
    return InvalidArgumentError(where + ": name length " + std::to_string(name.size()) +
                                " is outside 1.." + std::to_string(GgufFile::kMaxTensorNameBytes));
  }
  if (tensor_names_.count(name) != 0) return InvalidArgumentError(where + ": added twice");
  if (dims.empty() || dims.size() > static_cast<size_t>(GgufFile::kMaxDims)) {
    return InvalidArgumentError(where + ": " + std::to_string(dims.size()) +
                                " dimensions; GGUF tensors have 1.." +
                                std::to_string(GgufFile::kMaxDims));
  }
  std::optional<GgmlTypeTraits> traits = GgmlTypeTraitsOf(type);
  if (!traits) {
    return InvalidArgumentError(where + ": unknown ggml type " +
                                std::to_string(static_cast<uint32_t>(type)));
  }
  int64_t n_elements = 0;
  uint64_t size_bytes = 0;
  std::string why;
  if (!TensorSize(dims, *traits, &n_elements, &size_bytes, &why)) {
    return InvalidArgumentError(where + ": " + why);
  }
  if (size_bytes != data.size()) {
    return InvalidArgumentError(where + ": data holds " + std::to_string(data.size()) +
                                " bytes but " + std::to_string(n_elements) + " " +
                                std::string(traits->name) + " elements take " +
                                std::to_string(size_bytes));
  }
  tensor_names_.emplace(name, tensors_.size());
  tensors_.push_back(PendingTensor{std::move(name), std::move(dims), type, data});
  return OkStatus();
}

namespace {

void PutString(std::string_view s, std::string* out) {
  StoreLE(s.size(), 8, out);
  out->append(s.data(), s.size());
}

}  // namespace

// The value's encoding without its type tag (an array: element type, count,
// elements). Scalars and arrays of scalars are kept in file byte order.
void GgufWriter::PutValue(const GgufValue& v, std::string* out) {
  switch (v.type_) {
    case GgufValueType::kString:
      PutString(v.bytes_, out);
      return;
    case GgufValueType::kArray:
      StoreLE(static_cast<uint32_t>(v.element_type_), 4, out);
      StoreLE(v.count_, 8, out);
      if (v.element_type_ == GgufValueType::kString) {
        for (size_t i = 0; i < v.size(); ++i) PutString(v.StringAt(i), out);
      } else if (v.element_type_ == GgufValueType::kArray) {
        for (const GgufValue& e : v.arrays_) PutValue(e, out);
      } else {
        out->append(v.bytes_);
      }
      return;
    default:
      StoreLE(v.bits_, ScalarBytes(v.type_), out);
      return;
  }
}

Status GgufWriter::Emit(const std::function<Status(const void*, size_t)>& append) const {
  std::string head;
  head.append(kMagic, 4);
  StoreLE(kWriteVersion, 4, &head);
  StoreLE(tensors_.size(), 8, &head);
  StoreLE(metadata_.size(), 8, &head);
  for (const GgufMetadataEntry& e : metadata_) {
    PutString(e.key, &head);
    StoreLE(static_cast<uint32_t>(e.value.type()), 4, &head);
    PutValue(e.value, &head);
  }
  std::vector<uint64_t> offsets;
  offsets.reserve(tensors_.size());
  uint64_t end = 0;
  for (const PendingTensor& t : tensors_) {
    const uint64_t offset = AlignUp(end, alignment_);
    offsets.push_back(offset);
    end = offset + t.data.size();
    PutString(t.name, &head);
    StoreLE(t.dims.size(), 4, &head);
    for (int64_t d : t.dims) StoreLE(static_cast<uint64_t>(d), 8, &head);
    StoreLE(static_cast<uint32_t>(t.type), 4, &head);
    StoreLE(offset, 8, &head);
  }
  // The data section starts aligned; a file without tensors has none.
  if (!tensors_.empty()) head.resize(AlignUp(head.size(), alignment_), '\0');
  ARBITER_RETURN_IF_ERROR(append(head.data(), head.size()));

  static const char kZeros[4096] = {};
  uint64_t written = 0;  // bytes of the data section so far
  for (size_t i = 0; i < tensors_.size(); ++i) {
    while (written < offsets[i]) {
      const size_t n = static_cast<size_t>(std::min<uint64_t>(offsets[i] - written, sizeof(kZeros)));
      ARBITER_RETURN_IF_ERROR(append(kZeros, n));
      written += n;
    }
    if (!tensors_[i].data.empty()) {
      ARBITER_RETURN_IF_ERROR(append(tensors_[i].data.data(), tensors_[i].data.size()));
    }
    written += tensors_[i].data.size();
  }
  return OkStatus();
}

std::string GgufWriter::Serialize() const {
  std::string out;
  Status s = Emit([&out](const void* p, size_t n) {
    out.append(static_cast<const char*>(p), n);
    return OkStatus();
  });
  s.IgnoreError();  // appending to a string cannot fail
  return out;
}

Status GgufWriter::Write(const std::string& path) const {
  return WriteFileAtomicStreaming(path, [this](const std::function<Status(const void*, size_t)>& append) {
    return Emit(append);
  });
}

}  // namespace arbiter
