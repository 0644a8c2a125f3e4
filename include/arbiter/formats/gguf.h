// arbiter/formats/gguf.h — GGUF reader and writer.
//
// Format (ggml's docs/gguf.md; versions 2 and 3, which are identical for
// little-endian files — 3 only added big-endian files, which we refuse). All
// integers little-endian; a string is a u64 byte length then the bytes (no
// terminator):
//   u32 magic "GGUF"   u32 version   u64 tensor_count   u64 metadata_kv_count
//   metadata_kv_count × { string key; u32 value_type; value }
//       value: a scalar (u8 i8 u16 i16 u32 i32 f32 bool u64 i64 f64), a
//       string, or an array { u32 element_type; u64 count; count × element }
//       whose elements may themselves be arrays (each with its own type)
//   tensor_count × { string name; u32 n_dims; u64 dims[n_dims]; u32 type; u64 offset }
//   zero padding to a multiple of `alignment`, then the data section.
// `alignment` is the u32 metadata value "general.alignment" (a power of two),
// 32 when absent. Tensor dims are in ggml order: dims[0] is the innermost
// (contiguous) dimension, the length of a row; the row-major shape Hugging
// Face uses is dims reversed. `type` is a ggml type (arbiter/formats/ggml_type.h);
// a row of dims[0] elements takes GgmlRowBytes(type, dims[0]) bytes. `offset`
// is relative to the start of the data section.
//
// The reader validates everything before exposing anything:
//   - magic; version 2 or 3 (1, byte-swapped and future versions refused by
//     name); every read within the input (truncation anywhere is kDataLoss);
//   - counts bounded by the bytes left, so a hostile count never allocates:
//     tensor_count and metadata_kv_count by the smallest possible entry, an
//     array's count by its smallest possible element;
//   - value types known; bools 0 or 1; arrays nested at most kMaxArrayDepth
//     deep, with at most kMaxNestedArrays arrays inside arrays per file;
//   - keys 1..65535 bytes and unique; tensor names 1..64 bytes and unique;
//   - "general.alignment", when present, a u32 power of two;
//   - 1 ≤ n_dims ≤ 4; every dim ≤ 2^63 − 1; the element count and the byte
//     size (rows × row bytes) without overflow; dims[0] a multiple of the
//     type's block size; the type a ggml type (kUnimplemented otherwise);
//   - the data section start (the end of the tensor infos rounded up to the
//     alignment) within the file when the file has tensors; every tensor
//     offset a multiple of the alignment; data_offset + offset + size ≤ the
//     file size; no two tensors' bytes overlapping (holes are allowed).
// Strings are kept as bytes; nothing checks they are UTF-8.
//
// Errors: kDataLoss for corrupt or truncated files, naming the file and the
// key or tensor ("model.gguf: key \"general.alignment\": ...",
// "model.gguf: tensor \"blk.0.attn_q.weight\": ...") and the byte offset
// where it matters; kUnimplemented for valid files we cannot read (version
// 1, big-endian, a ggml type we do not know — naming the tensor and the type
// value); OpenGguf adds the errors of MappedFile::Open. No exception escapes.
//
// Memory: a GgufFile owns copies of the metadata and tensor infos, never the
// tensor data, and keeps no mapping or file descriptor open. Arrays of
// scalars are stored as one byte buffer and arrays of strings as one
// concatenated buffer plus end offsets, so a 150,000-entry token list costs
// two allocations, not one per token.
//
// Usage:
//   Result<GgufFile> gguf = OpenGguf("/models/qwen3-0.6b-q8_0.gguf");
//   if (!gguf.ok()) return gguf.status();
//   Result<uint64_t> layers = gguf->GetUint("qwen3.block_count");
//   const GgufTensorInfo* t = gguf->FindTensor("token_embd.weight");
//   // bytes of t: pread(fd, buf, t->size_bytes, gguf->data_offset() + t->offset)
//
// Thread safety: GgufValue and GgufFile are immutable after construction
// (thread-safe for concurrent reads). GgufWriter is thread-compatible.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "arbiter/base/status.h"
#include "arbiter/formats/ggml_type.h"

namespace arbiter {

// gguf_type: the metadata value types and their numeric values in the file.
enum class GgufValueType : uint32_t {
  kUint8 = 0,
  kInt8 = 1,
  kUint16 = 2,
  kInt16 = 3,
  kUint32 = 4,
  kInt32 = 5,
  kFloat32 = 6,
  kBool = 7,
  kString = 8,
  kArray = 9,
  kUint64 = 10,
  kInt64 = 11,
  kFloat64 = 12,
};

// "u8", "i8", "u16", "i16", "u32", "i32", "f32", "bool", "string", "array",
// "u64", "i64", "f64"; "type ?" for a value outside the enum.
std::string_view GgufValueTypeName(GgufValueType type);

// One metadata value: a scalar, a string or an array. A value is immutable
// once built; copies are deep.
class GgufValue {
 public:
  // A u8 0.
  GgufValue() = default;

  // Scalars and strings.
  static GgufValue Uint8(uint8_t v);
  static GgufValue Int8(int8_t v);
  static GgufValue Uint16(uint16_t v);
  static GgufValue Int16(int16_t v);
  static GgufValue Uint32(uint32_t v);
  static GgufValue Int32(int32_t v);
  static GgufValue Float32(float v);
  static GgufValue Bool(bool v);
  static GgufValue String(std::string_view v);
  static GgufValue Uint64(uint64_t v);
  static GgufValue Int64(int64_t v);
  static GgufValue Float64(double v);

  // Arrays. IntArray: `element_type` is one of the eight integer types and
  // every value must fit it; FloatArray: kFloat32 (values rounded) or
  // kFloat64; ArrayOfArrays: every element must itself be an array.
  // kInvalidArgument otherwise, naming the index.
  static GgufValue StringArray(const std::vector<std::string>& items);
  static Result<GgufValue> IntArray(GgufValueType element_type, const std::vector<int64_t>& items);
  static Result<GgufValue> FloatArray(GgufValueType element_type, const std::vector<double>& items);
  static GgufValue BoolArray(const std::vector<bool>& items);
  static Result<GgufValue> ArrayOfArrays(std::vector<GgufValue> items);

  GgufValueType type() const { return type_; }
  bool is_array() const { return type_ == GgufValueType::kArray; }

  // Scalar reads; nullopt when the type does not match or the value does not
  // fit. AsUint: any integer type holding a value ≥ 0. AsInt: any integer
  // type holding a value ≤ 2^63 − 1. AsFloat: f32 or f64 only. AsString: a
  // view into this value.
  std::optional<uint64_t> AsUint() const;
  std::optional<int64_t> AsInt() const;
  std::optional<double> AsFloat() const;
  std::optional<bool> AsBool() const;
  std::optional<std::string_view> AsString() const;

  // Arrays. element_type() is the array's element type (kUint8 for a
  // scalar); size() its element count (0 for a scalar).
  GgufValueType element_type() const { return element_type_; }
  size_t size() const { return is_array() ? static_cast<size_t>(count_) : 0; }
  // Element i as a value of its own (a nested array is copied). A default
  // GgufValue when this is not an array or i ≥ size().
  GgufValue At(size_t i) const;
  // Element i of an array of strings, without a copy; "" when this is not
  // an array of strings or i ≥ size().
  std::string_view StringAt(size_t i) const;
  // Element i of an array of arrays, without a copy; an empty array when
  // this is not an array of arrays or i ≥ size().
  const GgufValue& ArrayAt(size_t i) const;

  // Same type, element type and contents (floats compared bit for bit).
  friend bool operator==(const GgufValue& a, const GgufValue& b);

 private:
  friend class GgufParser;
  friend class GgufWriter;

  GgufValueType type_ = GgufValueType::kUint8;
  GgufValueType element_type_ = GgufValueType::kUint8;  // arrays only
  uint64_t bits_ = 0;   // scalar: the value's little-endian bytes, zero-extended
  uint64_t count_ = 0;  // array: element count
  // string: the bytes; array of scalars: count × element size bytes, as in
  // the file; array of strings: the strings concatenated.
  std::string bytes_;
  std::vector<uint64_t> ends_;      // array of strings: end of string i in bytes_
  std::vector<GgufValue> arrays_;   // array of arrays: the elements
};

struct GgufMetadataEntry {
  std::string key;
  GgufValue value;
};

struct GgufTensorInfo {
  std::string name;
  std::vector<int64_t> dims;   // ggml order, dims[0] innermost (the row length); 1..4 entries
  GgmlType type = GgmlType::kF32;
  uint64_t offset = 0;         // bytes from GgufFile::data_offset(); a multiple of the alignment
  uint64_t size_bytes = 0;     // (n_elements / dims[0]) × GgmlRowBytes(type, dims[0])
  int64_t n_elements = 0;      // prod(dims)

  // The row-major shape, outermost first: dims reversed ([out, in] for a
  // projection stored as dims [in, out]).
  std::vector<int64_t> RowMajorShape() const;
};

class GgufFile {
 public:
  static constexpr uint64_t kDefaultAlignment = 32;
  static constexpr int kMaxArrayDepth = 8;               // an array in an array is depth 2
  static constexpr uint64_t kMaxNestedArrays = 1u << 20; // arrays inside arrays, per file
  static constexpr size_t kMaxKeyBytes = 65535;
  static constexpr size_t kMaxTensorNameBytes = 64;
  static constexpr int kMaxDims = 4;

  // The path or name given to OpenGguf / ParseGguf; prefixes every message.
  const std::string& name() const { return name_; }
  uint32_t version() const { return version_; }
  uint64_t alignment() const { return alignment_; }
  // Absolute file offset of the data section (a multiple of alignment()).
  uint64_t data_offset() const { return data_offset_; }
  uint64_t file_size() const { return file_size_; }

  // In file order.
  const std::vector<GgufMetadataEntry>& metadata() const { return metadata_; }
  // nullptr when absent. O(log n).
  const GgufValue* FindValue(std::string_view key) const;

  // In file order.
  const std::vector<GgufTensorInfo>& tensors() const { return tensors_; }
  // nullptr when absent. O(log n).
  const GgufTensorInfo* FindTensor(std::string_view name) const;

  // Typed metadata reads. Errors: kNotFound when the key is absent ("<file>:
  // key \"k\" is missing"); kDataLoss when it holds another type or a value
  // that does not fit, naming the key, the type found and the type expected.
  //   GetString        a string
  //   GetUint          any integer type holding a value ≥ 0
  //   GetInt           any integer type holding a value ≤ 2^63 − 1
  //   GetFloat         f32 or f64
  //   GetBool          bool
  //   GetStringArray   an array of strings
  //   GetIntArray      an array of any integer type whose values fit int64
  //   GetFloatArray    an array of f32 or f64
  Result<std::string> GetString(std::string_view key) const;
  Result<uint64_t> GetUint(std::string_view key) const;
  Result<int64_t> GetInt(std::string_view key) const;
  Result<double> GetFloat(std::string_view key) const;
  Result<bool> GetBool(std::string_view key) const;
  Result<std::vector<std::string>> GetStringArray(std::string_view key) const;
  Result<std::vector<int64_t>> GetIntArray(std::string_view key) const;
  Result<std::vector<double>> GetFloatArray(std::string_view key) const;

 private:
  friend class GgufParser;

  std::string name_;
  uint32_t version_ = 0;
  uint64_t alignment_ = kDefaultAlignment;
  uint64_t data_offset_ = 0;
  uint64_t file_size_ = 0;
  std::vector<GgufMetadataEntry> metadata_;
  std::vector<GgufTensorInfo> tensors_;
  std::vector<uint32_t> keys_sorted_;     // indices into metadata_, by key
  std::vector<uint32_t> tensors_sorted_;  // indices into tensors_, by name
};

// Parses a whole GGUF file held in memory (the fuzzer and tests); `bytes` is
// not referenced after the call. `name` prefixes every error message.
Result<GgufFile> ParseGguf(std::string_view bytes, const std::string& name);

// Maps `path` read-only, parses it and unmaps it: the result keeps no mapping
// or descriptor. Only the header's pages are read. Errors as ParseGguf plus
// MappedFile::Open's (kNotFound, kPermissionDenied, ...).
Result<GgufFile> OpenGguf(const std::string& path);

// Builds a GGUF version 3 file: metadata in the order added, then the tensor
// infos, then each tensor's bytes at the next multiple of the alignment (the
// value of "general.alignment" when added, else 32; padding is zeros). The
// file ends with the last tensor's bytes (a file without tensors ends after
// the metadata, unpadded).
//
// Usage:
//   GgufWriter w;
//   ARBITER_RETURN_IF_ERROR(w.Add("general.architecture", GgufValue::String("llama")));
//   ARBITER_RETURN_IF_ERROR(w.AddTensor("output_norm.weight", {64}, GgmlType::kF32, bytes));
//   ARBITER_RETURN_IF_ERROR(w.Write("/tmp/model.gguf"));
class GgufWriter {
 public:
  // Adds a metadata entry. kInvalidArgument on an empty key or one over
  // 65535 bytes, a key added twice, or a "general.alignment" that is not a
  // u32 power of two.
  Status Add(std::string key, GgufValue value);
  // Shorthands for Add.
  Status AddString(std::string key, std::string_view value);
  Status AddUint32(std::string key, uint32_t value);
  Status AddFloat32(std::string key, float value);
  Status AddBool(std::string key, bool value);
  Status AddStringArray(std::string key, const std::vector<std::string>& items);

  // Adds a tensor. `dims` in ggml order (dims[0] the row length), 1..4
  // entries ≥ 0; `data` holds exactly the tensor's bytes and is NOT copied:
  // it must stay valid until the last Write/Serialize call. kInvalidArgument
  // (naming the tensor) on an empty, over-64-byte or repeated name, bad
  // dims, an unknown type, dims[0] not a multiple of the block size, or a
  // data size that does not match.
  Status AddTensor(std::string name, std::vector<int64_t> dims, GgmlType type,
                   std::string_view data);

  uint64_t alignment() const { return alignment_; }

  // The file image in memory.
  std::string Serialize() const;
  // Writes the file atomically (WriteFileAtomicStreaming: temp file in the
  // same directory, fsync, rename); on error `path` is untouched.
  Status Write(const std::string& path) const;

 private:
  struct PendingTensor {
    std::string name;
    std::vector<int64_t> dims;
    GgmlType type;
    std::string_view data;
  };
  Status Emit(const std::function<Status(const void*, size_t)>& append) const;
  static void PutValue(const GgufValue& v, std::string* out);

  uint64_t alignment_ = GgufFile::kDefaultAlignment;
  std::vector<GgufMetadataEntry> metadata_;
  std::map<std::string, size_t, std::less<>> keys_;
  std::vector<PendingTensor> tensors_;
  std::map<std::string, size_t, std::less<>> tensor_names_;
};

}  // namespace arbiter
