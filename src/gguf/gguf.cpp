// GGUF reading and writing.
//
// Layout (all little-endian): "GGUF", u32 version, u64 n_tensors, u64 n_kv; n_kv metadata entries
// (string key, u32 value type, value; an array is u32 element type, u64 count, elements; a string is u64
// length then bytes, no terminator); n_tensors tensor infos (string name, u32 n_dims, n_dims x i64 ne,
// u32 ggml type, u64 offset); then, at the next multiple of `general.alignment` (default 32) counted from
// the start of the file, the data section, in which every tensor offset is itself aligned. Versions 2 and 3
// share this layout (v3 only allowed big-endian files, which we reject); v1 used 32-bit counts.
//
// The reader maps the file read-only and never copies tensor data: TensorInfo::data points into the
// mapping, which lives as long as the File. It trusts nothing: every read is bounds-checked and names the
// field it was reading, every count is checked against the bytes left in the file before anything is
// allocated for it, and tensor shapes, types, offsets and sizes are validated up front, so that code
// holding a File may index tensor data without further checks. Errors are one line:
// "<path>: <field>: <what is wrong>".
#include "gguf/gguf.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <limits>
#include <utility>

#include "util/error.h"

static_assert(std::endian::native == std::endian::little, "GGUF is read by reinterpreting little-endian bytes");

namespace sparrow::gguf {
namespace {

constexpr char kMagic[4] = {'G', 'G', 'U', 'F'};
constexpr uint32_t kWriteVersion = 3;
constexpr size_t kHeaderBytes = 4 + 4 + 8 + 8;  // magic, version, n_tensors, n_kv
constexpr size_t kDefaultAlignment = 32;
constexpr std::string_view kAlignmentKey = "general.alignment";
constexpr uint32_t kMaxDims = 4;
// ggml keeps tensor names in a char[64] with a terminator; llama.cpp rejects longer names.
constexpr size_t kMaxTensorNameBytes = 63;
// Lower bounds on the bytes one entry occupies, used to reject counts the file cannot hold before
// allocating for them. A metadata entry: key length, >= 1 key byte, value type, >= 1 value byte.
// A tensor info: name length, n_dims, >= 1 dimension, type, offset.
constexpr uint64_t kMinKvBytes = 8 + 1 + 4 + 1;
constexpr uint64_t kMinTensorInfoBytes = 8 + 4 + 8 + 4 + 8;
// Sanity limits on what a count may make us allocate even when the file is large enough to hold it: a
// corrupt length inside a multi-gigabyte model must not turn into a multi-gigabyte allocation. The largest
// real values are chat templates (tens of KiB) and vocabularies or merge lists (about a million entries).
constexpr uint64_t kMaxStringBytes = uint64_t{64} << 20;
constexpr uint64_t kMaxArrayElements = uint64_t{1} << 24;
// Strings of an array are reserved up front only up to this many; beyond, the vector grows as strings are read.
constexpr uint64_t kStringArrayReserve = uint64_t{1} << 20;

// Keys and tensor names are arbitrary bytes; control characters are escaped so a message stays one line.
void append_printable(std::string& out, std::string_view text) {
  static const char kHex[] = "0123456789abcdef";
  for (char c : text) {
    const auto byte = static_cast<unsigned char>(c);
    if (byte >= 0x20 && byte != 0x7F) {
      out += c;
    } else {
      out.append("\\x").append(1, kHex[byte >> 4]).append(1, kHex[byte & 15]);
    }
  }
}

[[noreturn]] void fail(std::string_view path, std::string_view field, const std::string& what) {
  std::string message;
  append_printable(message, path);
  message.append(": ");
  append_printable(message, field);
  message.append(": ");
  append_printable(message, what);
  throw Error(message);
}

bool is_known_value_type(uint32_t t) { return t <= static_cast<uint32_t>(ValueType::FLOAT64); }

bool is_unsigned_int(ValueType t) {
  return t == ValueType::UINT8 || t == ValueType::UINT16 || t == ValueType::UINT32 || t == ValueType::UINT64;
}
bool is_signed_int(ValueType t) {
  return t == ValueType::INT8 || t == ValueType::INT16 || t == ValueType::INT32 || t == ValueType::INT64;
}
bool is_float(ValueType t) { return t == ValueType::FLOAT32 || t == ValueType::FLOAT64; }

// Bytes of one scalar of type t in the file; strings have a variable size (8 is their length prefix).
uint64_t scalar_file_bytes(ValueType t) {
  switch (t) {
    case ValueType::UINT8: case ValueType::INT8: case ValueType::BOOL: return 1;
    case ValueType::UINT16: case ValueType::INT16: return 2;
    case ValueType::UINT32: case ValueType::INT32: case ValueType::FLOAT32: return 4;
    case ValueType::UINT64: case ValueType::INT64: case ValueType::FLOAT64: return 8;
    case ValueType::STRING: return 8;
    case ValueType::ARRAY: return 4 + 8;
  }
  return 1;
}

std::string value_type_name(ValueType t) {
  switch (t) {
    case ValueType::UINT8: return "uint8";
    case ValueType::INT8: return "int8";
    case ValueType::UINT16: return "uint16";
    case ValueType::INT16: return "int16";
    case ValueType::UINT32: return "uint32";
    case ValueType::INT32: return "int32";
    case ValueType::FLOAT32: return "float32";
    case ValueType::BOOL: return "bool";
    case ValueType::STRING: return "string";
    case ValueType::ARRAY: return "array";
    case ValueType::UINT64: return "uint64";
    case ValueType::INT64: return "int64";
    case ValueType::FLOAT64: return "float64";
  }
  return "type " + std::to_string(static_cast<uint32_t>(t));
}

// "uint32" for a scalar, "array of string" for an array.
std::string describe_type(const Value& v) {
  if (v.type != ValueType::ARRAY) return value_type_name(v.type);
  return "array of " + value_type_name(v.element_type);
}

std::string shape_string(const int64_t* ne, size_t n_dims) {
  std::string s = "{";
  for (size_t d = 0; d < n_dims; ++d) {
    if (d > 0) s += ',';
    s += std::to_string(ne[d]);
  }
  return s + "}";
}

// Whether an integer value fits in the integer type t (always true for non-integer types).
bool fits_unsigned(ValueType t, uint64_t u) {
  switch (t) {
    case ValueType::UINT8: return u <= UINT8_MAX;
    case ValueType::UINT16: return u <= UINT16_MAX;
    case ValueType::UINT32: return u <= UINT32_MAX;
    case ValueType::BOOL: return u <= 1;
    default: return true;
  }
}
bool fits_signed(ValueType t, int64_t i) {
  switch (t) {
    case ValueType::INT8: return i >= INT8_MIN && i <= INT8_MAX;
    case ValueType::INT16: return i >= INT16_MIN && i <= INT16_MAX;
    case ValueType::INT32: return i >= INT32_MIN && i <= INT32_MAX;
    default: return true;
  }
}

// Product of the dimensions, or nullopt when it overflows int64. Dimensions are positive.
std::optional<int64_t> checked_element_count(const int64_t* ne, size_t n_dims) {
  int64_t count = 1;
  for (size_t d = 0; d < n_dims; ++d) {
    if (ne[d] > std::numeric_limits<int64_t>::max() / count) return std::nullopt;
    count *= ne[d];
  }
  return count;
}

// Bytes of a tensor of `elements` elements (a multiple of the block size), or nullopt on size_t overflow.
std::optional<size_t> checked_tensor_bytes(const TensorTypeInfo& info, int64_t elements) {
  const uint64_t blocks = static_cast<uint64_t>(elements) / info.block_elements;
  if (blocks > std::numeric_limits<size_t>::max() / info.block_bytes) return std::nullopt;
  return static_cast<size_t>(blocks * info.block_bytes);
}

uint64_t align_up(uint64_t n, uint64_t alignment) { return (n + alignment - 1) / alignment * alignment; }

// ---------------------------------------------------------------------------------------------------------
// Reading

// The name of the field being read, for messages: "tokenizer.ggml.tokens", or with an index
// "tokenizer.ggml.tokens[17]". Built only when an error is reported, never per element read.
struct Field {
  Field(std::string_view name) : name(name) {}
  Field(const std::string& name) : name(name) {}
  Field(const char* name) : name(name) {}
  Field(std::string_view name, uint64_t index) : name(name), index(index), indexed(true) {}
  std::string str() const {
    std::string s(name);
    if (indexed) s.append("[").append(std::to_string(index)).append("]");
    return s;
  }
  std::string_view name;
  uint64_t index = 0;
  bool indexed = false;
};

// A bounds-checked read position in the mapped file. Every read names the field it is for, so that a
// truncated file says which field ran past the end.
class Cursor {
 public:
  Cursor(const std::string& path, const uint8_t* data, size_t size) : path_(path), data_(data), size_(size) {}

  size_t pos() const { return pos_; }
  uint64_t remaining() const { return size_ - pos_; }
  const std::string& path() const { return path_; }
  const uint8_t* here() const { return data_ + pos_; }
  void skip(uint64_t bytes) { pos_ += bytes; }  // after need(bytes)

  void need(uint64_t bytes, const Field& field) const {
    if (bytes > remaining()) {
      fail(path_, field.str(), "truncated: needs " + std::to_string(bytes) + " bytes at offset " +
                                   std::to_string(pos_) + " but the file ends at " + std::to_string(size_));
    }
  }

  template <class T>
  T read(const Field& field) {
    need(sizeof(T), field);
    T value;
    std::memcpy(&value, data_ + pos_, sizeof(T));
    pos_ += sizeof(T);
    return value;
  }

  std::string read_string(const Field& field) {
    const uint64_t length = read<uint64_t>(field);
    if (length > remaining()) {
      fail(path_, field.str(), "string length " + std::to_string(length) + " exceeds the " +
                                   std::to_string(remaining()) + " bytes left in the file");
    }
    if (length > kMaxStringBytes) {
      fail(path_, field.str(), "string length " + std::to_string(length) + " exceeds the limit of " +
                                   std::to_string(kMaxStringBytes) + " bytes");
    }
    std::string s(reinterpret_cast<const char*>(data_ + pos_), length);
    pos_ += length;
    return s;
  }

  // Rejects a count of entries of at least min_bytes each that cannot fit in the rest of the file.
  void check_count(uint64_t count, uint64_t min_bytes, const Field& field, std::string_view what) const {
    if (count > remaining() / min_bytes) {
      fail(path_, field.str(), std::to_string(count) + " " + std::string(what) + " cannot fit in the " +
                                   std::to_string(remaining()) + " bytes left in the file (each needs at least " +
                                   std::to_string(min_bytes) + ")");
    }
  }

 private:
  const std::string& path_;
  const uint8_t* data_;
  size_t size_;
  size_t pos_ = 0;
};

ValueType read_value_type(Cursor& cur, std::string_view field, std::string_view what) {
  const uint32_t id = cur.read<uint32_t>(field);
  if (!is_known_value_type(id)) fail(cur.path(), field, "unknown " + std::string(what) + " " + std::to_string(id));
  return static_cast<ValueType>(id);
}

// Reads one scalar of type t into the Value fields the header documents (u, i, f or s).
void read_scalar(Cursor& cur, ValueType t, std::string_view field, Value& v) {
  switch (t) {
    case ValueType::UINT8: v.u = cur.read<uint8_t>(field); break;
    case ValueType::UINT16: v.u = cur.read<uint16_t>(field); break;
    case ValueType::UINT32: v.u = cur.read<uint32_t>(field); break;
    case ValueType::UINT64: v.u = cur.read<uint64_t>(field); break;
    case ValueType::BOOL: v.u = cur.read<uint8_t>(field) != 0; break;
    case ValueType::INT8: v.i = cur.read<int8_t>(field); break;
    case ValueType::INT16: v.i = cur.read<int16_t>(field); break;
    case ValueType::INT32: v.i = cur.read<int32_t>(field); break;
    case ValueType::INT64: v.i = cur.read<int64_t>(field); break;
    case ValueType::FLOAT32: v.f = cur.read<float>(field); break;
    case ValueType::FLOAT64: v.f = cur.read<double>(field); break;
    case ValueType::STRING: v.s = cur.read_string(field); break;
    case ValueType::ARRAY: fail(cur.path(), field, "nested arrays are not supported");
  }
}

// Appends `count` little-endian values of file type T to out (whose element type is wider).
template <class T, class Out>
void read_numbers(Cursor& cur, uint64_t count, std::string_view field, std::vector<Out>& out) {
  cur.need(count * sizeof(T), field);  // count was checked against the remaining bytes: no overflow
  out.resize(count);
  const uint8_t* p = cur.here();
  for (uint64_t k = 0; k < count; ++k) {
    T value;
    std::memcpy(&value, p + k * sizeof(T), sizeof(T));
    out[k] = static_cast<Out>(value);
  }
  cur.skip(count * sizeof(T));
}

void read_array_elements(Cursor& cur, uint64_t count, std::string_view field, Value& v) {
  switch (v.element_type) {
    case ValueType::UINT8: read_numbers<uint8_t>(cur, count, field, v.array_u); break;
    case ValueType::UINT16: read_numbers<uint16_t>(cur, count, field, v.array_u); break;
    case ValueType::UINT32: read_numbers<uint32_t>(cur, count, field, v.array_u); break;
    case ValueType::UINT64: read_numbers<uint64_t>(cur, count, field, v.array_u); break;
    case ValueType::BOOL:
      read_numbers<uint8_t>(cur, count, field, v.array_u);
      for (uint64_t& b : v.array_u) b = b != 0;
      break;
    case ValueType::INT8: read_numbers<int8_t>(cur, count, field, v.array_i); break;
    case ValueType::INT16: read_numbers<int16_t>(cur, count, field, v.array_i); break;
    case ValueType::INT32: read_numbers<int32_t>(cur, count, field, v.array_i); break;
    case ValueType::INT64: read_numbers<int64_t>(cur, count, field, v.array_i); break;
    case ValueType::FLOAT32: read_numbers<float>(cur, count, field, v.array_f); break;
    case ValueType::FLOAT64: read_numbers<double>(cur, count, field, v.array_f); break;
    case ValueType::STRING:
      v.array_s.reserve(std::min<uint64_t>(count, kStringArrayReserve));
      for (uint64_t k = 0; k < count; ++k) v.array_s.push_back(cur.read_string(Field(field, k)));
      break;
    case ValueType::ARRAY: fail(cur.path(), field, "nested arrays are not supported");
  }
}

void read_array(Cursor& cur, std::string_view field, Value& v) {
  v.element_type = read_value_type(cur, field, "array element type");
  if (v.element_type == ValueType::ARRAY) fail(cur.path(), field, "nested arrays are not supported");
  const uint64_t count = cur.read<uint64_t>(field);
  cur.check_count(count, scalar_file_bytes(v.element_type), field,
                  "array elements of type " + value_type_name(v.element_type));
  if (count > kMaxArrayElements) {
    fail(cur.path(), field, "array length " + std::to_string(count) + " exceeds the limit of " +
                                std::to_string(kMaxArrayElements) + " elements");
  }
  read_array_elements(cur, count, field, v);
}

Value read_value(Cursor& cur, std::string_view key) {
  Value v;
  v.type = read_value_type(cur, key, "value type");
  if (v.type == ValueType::ARRAY) read_array(cur, key, v);
  else read_scalar(cur, v.type, key, v);
  return v;
}

// The fixed-size start of the file.
struct Header {
  uint32_t version = 0;
  uint64_t n_tensors = 0;
  uint64_t n_kv = 0;
};

// Reads magic, version and the two counts, rejecting counts the rest of the file cannot hold.
Header read_fixed_header(Cursor& cur) {
  char magic[4];
  for (char& c : magic) c = static_cast<char>(cur.read<uint8_t>("magic"));
  if (std::memcmp(magic, kMagic, 4) != 0) {
    std::string shown;
    for (char c : magic) shown += std::isprint(static_cast<unsigned char>(c)) ? c : '?';
    fail(cur.path(), "magic", "expected \"GGUF\", found \"" + shown + "\" (not a GGUF file)");
  }
  Header h;
  h.version = cur.read<uint32_t>("version");
  if (h.version != 0 && (h.version & 0xFFFF) == 0) {
    fail(cur.path(), "version", std::to_string(h.version) +
                                    " looks byte-swapped: big-endian GGUF files are not supported");
  }
  if (h.version != 2 && h.version != 3) {
    fail(cur.path(), "version", "unsupported version " + std::to_string(h.version) + " (supported: 2, 3)");
  }
  h.n_tensors = cur.read<uint64_t>("n_tensors");
  h.n_kv = cur.read<uint64_t>("n_kv");
  cur.check_count(h.n_kv, kMinKvBytes, "n_kv", "metadata entries");
  cur.check_count(h.n_tensors, kMinTensorInfoBytes, "n_tensors", "tensor infos");
  return h;
}

// general.alignment: any unsigned integer type (llama.cpp writes uint32), a power of two.
size_t read_alignment(const std::string& path, const std::map<std::string, Value, std::less<>>& metadata) {
  auto it = metadata.find(kAlignmentKey);
  if (it == metadata.end()) return kDefaultAlignment;
  const Value& v = it->second;
  if (!is_unsigned_int(v.type)) {
    fail(path, kAlignmentKey, "expected uint32, found " + describe_type(v));
  }
  if (v.u == 0 || !std::has_single_bit(v.u) || v.u > (uint64_t{1} << 30)) {
    fail(path, kAlignmentKey, std::to_string(v.u) + " is not a power of two (up to 2^30)");
  }
  return static_cast<size_t>(v.u);
}

TensorInfo read_tensor_info(Cursor& cur, uint64_t index) {
  TensorInfo t;
  const std::string index_field = "tensor #" + std::to_string(index);
  t.name = cur.read_string(index_field);
  if (t.name.empty()) fail(cur.path(), index_field, "empty tensor name");
  const std::string field = "tensor " + t.name;

  t.n_dims = cur.read<uint32_t>(field);
  if (t.n_dims == 0 || t.n_dims > kMaxDims) {
    fail(cur.path(), field, "n_dims = " + std::to_string(t.n_dims) + " (must be 1.." + std::to_string(kMaxDims) + ")");
  }
  for (uint32_t d = 0; d < t.n_dims; ++d) {
    t.ne[d] = cur.read<int64_t>(field);
    if (t.ne[d] <= 0) {
      fail(cur.path(), field, "ne[" + std::to_string(d) + "] = " + std::to_string(t.ne[d]) +
                                  " (dimensions must be positive)");
    }
  }
  const std::optional<int64_t> elements = checked_element_count(t.ne, t.n_dims);
  if (!elements) fail(cur.path(), field, "element count of shape " + shape_string(t.ne, t.n_dims) + " overflows int64");

  const uint32_t type_id = cur.read<uint32_t>(field);
  const TensorTypeInfo* info = tensor_type_info(type_id);
  if (info == nullptr) fail(cur.path(), field, "unknown tensor type id " + std::to_string(type_id));
  t.type = static_cast<TensorType>(type_id);
  if (t.ne[0] % info->block_elements != 0) {
    fail(cur.path(), field, "row of ne[0] = " + std::to_string(t.ne[0]) + " elements is not a multiple of the " +
                                std::string(info->name) + " block size " + std::to_string(info->block_elements));
  }
  const std::optional<size_t> nbytes = checked_tensor_bytes(*info, *elements);
  if (!nbytes) fail(cur.path(), field, "size in bytes of shape " + shape_string(t.ne, t.n_dims) + " overflows");
  t.nbytes = *nbytes;
  t.offset = cur.read<uint64_t>(field);
  return t;
}

// Checks each tensor's offset against the alignment and the data section, and that no two overlap; then
// points each tensor's data into the mapping.
void place_tensors(const std::string& path, std::vector<TensorInfo>& tensors, const uint8_t* data_section,
                   uint64_t data_bytes, size_t alignment) {
  for (TensorInfo& t : tensors) {
    const std::string field = "tensor " + t.name;
    if (t.offset % alignment != 0) {
      fail(path, field, "offset " + std::to_string(t.offset) + " is not a multiple of the alignment " +
                            std::to_string(alignment));
    }
    if (t.offset > std::numeric_limits<uint64_t>::max() - t.nbytes) {
      fail(path, field, "offset " + std::to_string(t.offset) + " + size " + std::to_string(t.nbytes) +
                            " overflows");
    }
    if (t.offset + t.nbytes > data_bytes) {
      fail(path, field, "data [" + std::to_string(t.offset) + ", " + std::to_string(t.offset + t.nbytes) +
                            ") runs past the end of the file (the data section has " + std::to_string(data_bytes) +
                            " bytes)");
    }
    t.data = data_section + t.offset;
  }
  std::vector<const TensorInfo*> by_offset;
  for (const TensorInfo& t : tensors) by_offset.push_back(&t);
  std::sort(by_offset.begin(), by_offset.end(),
            [](const TensorInfo* a, const TensorInfo* b) { return a->offset < b->offset; });
  for (size_t k = 1; k < by_offset.size(); ++k) {
    const TensorInfo& prev = *by_offset[k - 1];
    const TensorInfo& cur = *by_offset[k];
    if (prev.offset + prev.nbytes > cur.offset) {
      fail(path, "tensor " + cur.name, "data at offset " + std::to_string(cur.offset) + " overlaps tensor " +
                                           prev.name + " [" + std::to_string(prev.offset) + ", " +
                                           std::to_string(prev.offset + prev.nbytes) + ")");
    }
  }
}

// An open file descriptor closed on scope exit.
struct Fd {
  int fd = -1;
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
};

}  // namespace

// ---------------------------------------------------------------------------------------------------------
// Value and File

size_t Value::array_size() const {
  if (type != ValueType::ARRAY) return 0;
  if (is_unsigned_int(element_type) || element_type == ValueType::BOOL) return array_u.size();
  if (is_signed_int(element_type)) return array_i.size();
  if (is_float(element_type)) return array_f.size();
  if (element_type == ValueType::STRING) return array_s.size();
  return 0;
}

std::unique_ptr<File> File::open(const std::string& path) {
  std::unique_ptr<File> file(new File());
  file->path_ = path;

  Fd fd;
  fd.fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd.fd < 0) fail(path, "open", std::strerror(errno));
  struct stat st {};
  if (::fstat(fd.fd, &st) != 0) fail(path, "stat", std::strerror(errno));
  if (!S_ISREG(st.st_mode)) fail(path, "open", "not a regular file");
  const size_t size = static_cast<size_t>(st.st_size);
  if (size < kHeaderBytes) {
    fail(path, "header", "file too small: " + std::to_string(size) + " bytes, a GGUF header needs " +
                             std::to_string(kHeaderBytes));
  }
  void* mapping = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd.fd, 0);
  if (mapping == MAP_FAILED) fail(path, "mmap", std::strerror(errno));
  file->mapping_ = mapping;
  file->mapping_size_ = size;

  const uint8_t* bytes = static_cast<const uint8_t*>(mapping);
  Cursor cur(file->path_, bytes, size);
  const Header header = read_fixed_header(cur);
  file->version_ = header.version;

  for (uint64_t k = 0; k < header.n_kv; ++k) {
    std::string key = cur.read_string("key #" + std::to_string(k));
    if (key.empty()) fail(path, "key #" + std::to_string(k), "empty key");
    if (file->metadata_.count(key)) fail(path, key, "duplicate key");
    Value value = read_value(cur, key);
    file->metadata_.emplace(std::move(key), std::move(value));
  }
  file->alignment_ = read_alignment(path, file->metadata_);

  cur.check_count(header.n_tensors, kMinTensorInfoBytes, "n_tensors", "tensor infos");
  for (uint64_t k = 0; k < header.n_tensors; ++k) {
    TensorInfo t = read_tensor_info(cur, k);
    auto [it, inserted] = file->tensor_index_.emplace(t.name, file->tensors_.size());
    if (!inserted) {
      fail(path, "tensor " + t.name, "duplicate tensor name (also tensor #" + std::to_string(it->second) + ")");
    }
    file->tensors_.push_back(std::move(t));
  }

  // The data section starts at the next multiple of the alignment; a file without tensors may end first.
  const uint64_t data_start = align_up(cur.pos(), file->alignment_);
  if (header.n_tensors > 0 && data_start > size) {
    fail(path, "data section", "starts at offset " + std::to_string(data_start) + ", past the end of the file (" +
                                   std::to_string(size) + " bytes)");
  }
  const uint64_t data_bytes = data_start <= size ? size - data_start : 0;
  place_tensors(path, file->tensors_, bytes + std::min<uint64_t>(data_start, size), data_bytes, file->alignment_);
  return file;
}

File::~File() {
  if (mapping_ != nullptr) ::munmap(mapping_, mapping_size_);
}

const Value* File::find(std::string_view key) const {
  auto it = metadata_.find(key);
  return it == metadata_.end() ? nullptr : &it->second;
}

namespace {

const Value& require(const File& f, std::string_view key) {
  const Value* v = f.find(key);
  if (v == nullptr) fail(f.path(), key, "missing");
  return *v;
}

[[noreturn]] void wrong_type(const File& f, std::string_view key, std::string_view expected, const Value& found) {
  fail(f.path(), key, "expected " + std::string(expected) + ", found " + describe_type(found));
}

const Value& require_array(const File& f, std::string_view key, std::string_view expected, bool (*element_ok)(ValueType)) {
  const Value& v = require(f, key);
  if (v.type != ValueType::ARRAY || !element_ok(v.element_type)) wrong_type(f, key, expected, v);
  return v;
}

}  // namespace

uint64_t File::get_uint(std::string_view key) const {
  const Value& v = require(*this, key);
  if (is_unsigned_int(v.type)) return v.u;
  if (!is_signed_int(v.type)) wrong_type(*this, key, "an unsigned integer", v);
  if (v.i < 0) fail(path_, key, "value " + std::to_string(v.i) + " is negative, expected an unsigned integer");
  return static_cast<uint64_t>(v.i);
}

std::optional<uint64_t> File::get_uint_opt(std::string_view key) const {
  if (!has(key)) return std::nullopt;
  return get_uint(key);
}

double File::get_float(std::string_view key) const {
  const Value& v = require(*this, key);
  if (!is_float(v.type)) wrong_type(*this, key, "float32 or float64", v);
  return v.f;
}

std::optional<double> File::get_float_opt(std::string_view key) const {
  if (!has(key)) return std::nullopt;
  return get_float(key);
}

bool File::get_bool(std::string_view key) const {
  const Value& v = require(*this, key);
  if (v.type != ValueType::BOOL) wrong_type(*this, key, "bool", v);
  return v.u != 0;
}

std::string File::get_string(std::string_view key) const {
  const Value& v = require(*this, key);
  if (v.type != ValueType::STRING) wrong_type(*this, key, "string", v);
  return v.s;
}

std::optional<std::string> File::get_string_opt(std::string_view key) const {
  if (!has(key)) return std::nullopt;
  return get_string(key);
}

std::vector<int64_t> File::get_int_array(std::string_view key) const {
  const Value& v = require_array(*this, key, "array of integers", [](ValueType t) {
    return is_unsigned_int(t) || is_signed_int(t) || t == ValueType::BOOL;
  });
  if (is_signed_int(v.element_type)) return v.array_i;
  std::vector<int64_t> out;
  out.reserve(v.array_u.size());
  for (size_t k = 0; k < v.array_u.size(); ++k) {
    if (v.array_u[k] > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
      fail(path_, key, "element " + std::to_string(k) + " = " + std::to_string(v.array_u[k]) +
                           " does not fit in int64");
    }
    out.push_back(static_cast<int64_t>(v.array_u[k]));
  }
  return out;
}

std::vector<double> File::get_float_array(std::string_view key) const {
  return require_array(*this, key, "array of float32 or float64", is_float).array_f;
}

const std::vector<std::string>& File::get_string_array(std::string_view key) const {
  return require_array(*this, key, "array of string", [](ValueType t) { return t == ValueType::STRING; }).array_s;
}

std::vector<bool> File::get_bool_array(std::string_view key) const {
  const Value& v = require_array(*this, key, "array of bool", [](ValueType t) { return t == ValueType::BOOL; });
  return std::vector<bool>(v.array_u.begin(), v.array_u.end());
}

const TensorInfo* File::find_tensor(std::string_view name) const {
  auto it = tensor_index_.find(name);
  return it == tensor_index_.end() ? nullptr : &tensors_[it->second];
}

const TensorInfo& File::tensor(std::string_view name) const {
  const TensorInfo* t = find_tensor(name);
  if (t == nullptr) fail(path_, "tensor " + std::string(name), "missing");
  return *t;
}

void File::expect_shape(const TensorInfo& t, std::initializer_list<int64_t> ne) const {
  int64_t expected[kMaxDims] = {1, 1, 1, 1};
  bool matches = ne.size() <= kMaxDims;
  if (matches) std::copy(ne.begin(), ne.end(), expected);
  for (uint32_t d = 0; matches && d < kMaxDims; ++d) matches = t.ne[d] == expected[d];
  if (!matches) {
    fail(path_, "tensor " + t.name,
         "shape " + shape_string(t.ne, t.n_dims) + " expected " + shape_string(ne.begin(), ne.size()));
  }
}

// ---------------------------------------------------------------------------------------------------------
// Writing

namespace {

constexpr std::string_view kWriterName = "GGUF writer";

// The file being written, beside its final path: buffered, counting its bytes so that padding can be worked out,
// and removed unless commit() renamed it into place.
class OutputFile {
 public:
  explicit OutputFile(const std::string& path) : path_(path), tmp_path_(path + ".tmp") {
    file_ = std::fopen(tmp_path_.c_str(), "wb");
    if (file_ == nullptr) fail(tmp_path_, "open", std::strerror(errno));
    std::setvbuf(file_, nullptr, _IOFBF, kBufferBytes);
  }
  ~OutputFile() {
    if (file_ != nullptr) std::fclose(file_);
    if (!committed_) std::remove(tmp_path_.c_str());
  }
  OutputFile(const OutputFile&) = delete;
  OutputFile& operator=(const OutputFile&) = delete;

  const std::string& tmp_path() const { return tmp_path_; }

  void put_bytes(const void* data, size_t n) {
    if (n != 0 && std::fwrite(data, 1, n, file_) != n) fail(tmp_path_, "write", std::strerror(errno));
    position_ += n;
  }
  template <class T>
  void put(T value) {
    put_bytes(&value, sizeof(T));
  }
  void put_string(std::string_view s) {
    put<uint64_t>(s.size());
    put_bytes(s.data(), s.size());
  }
  // Zeros up to the next multiple of `alignment`, counted from the start of the file.
  void pad_to(uint64_t alignment) {
    static const uint8_t kZeros[4096] = {};
    uint64_t pad = align_up(position_, alignment) - position_;
    while (pad > 0) {
      const size_t n = static_cast<size_t>(std::min<uint64_t>(pad, sizeof(kZeros)));
      put_bytes(kZeros, n);
      pad -= n;
    }
  }
  void commit() {
    std::FILE* f = std::exchange(file_, nullptr);
    if (std::fclose(f) != 0) fail(tmp_path_, "close", std::strerror(errno));
    if (std::rename(tmp_path_.c_str(), path_.c_str()) != 0) fail(path_, "rename", std::strerror(errno));
    committed_ = true;
  }

 private:
  static constexpr size_t kBufferBytes = size_t{1} << 20;
  std::string path_;
  std::string tmp_path_;
  std::FILE* file_ = nullptr;
  uint64_t position_ = 0;
  bool committed_ = false;
};

void put_scalar(OutputFile& out, ValueType t, uint64_t u, int64_t i, double f, const std::string& s) {
  switch (t) {
    case ValueType::UINT8: out.put<uint8_t>(static_cast<uint8_t>(u)); break;
    case ValueType::UINT16: out.put<uint16_t>(static_cast<uint16_t>(u)); break;
    case ValueType::UINT32: out.put<uint32_t>(static_cast<uint32_t>(u)); break;
    case ValueType::UINT64: out.put<uint64_t>(u); break;
    case ValueType::BOOL: out.put<uint8_t>(u != 0); break;
    case ValueType::INT8: out.put<int8_t>(static_cast<int8_t>(i)); break;
    case ValueType::INT16: out.put<int16_t>(static_cast<int16_t>(i)); break;
    case ValueType::INT32: out.put<int32_t>(static_cast<int32_t>(i)); break;
    case ValueType::INT64: out.put<int64_t>(i); break;
    case ValueType::FLOAT32: out.put<float>(static_cast<float>(f)); break;
    case ValueType::FLOAT64: out.put<double>(f); break;
    case ValueType::STRING: out.put_string(s); break;
    case ValueType::ARRAY: break;  // rejected by check_value
  }
}

void put_value(OutputFile& out, const Value& v) {
  out.put<uint32_t>(static_cast<uint32_t>(v.type));
  if (v.type != ValueType::ARRAY) {
    put_scalar(out, v.type, v.u, v.i, v.f, v.s);
    return;
  }
  const ValueType t = v.element_type;
  out.put<uint32_t>(static_cast<uint32_t>(t));
  out.put<uint64_t>(v.array_size());
  static const std::string kNoString;
  if (is_unsigned_int(t) || t == ValueType::BOOL) {
    for (uint64_t u : v.array_u) put_scalar(out, t, u, 0, 0, kNoString);
  } else if (is_signed_int(t)) {
    for (int64_t i : v.array_i) put_scalar(out, t, 0, i, 0, kNoString);
  } else if (is_float(t)) {
    for (double f : v.array_f) put_scalar(out, t, 0, 0, f, kNoString);
  } else {
    for (const std::string& s : v.array_s) out.put_string(s);
  }
}

// Rejects a value the file format cannot hold exactly: unknown or nested types, integers out of range.
void check_value(const std::string& key, const Value& v) {
  if (key.empty()) fail(kWriterName, "key", "empty key");
  if (!is_known_value_type(static_cast<uint32_t>(v.type))) {
    fail(kWriterName, key, "unknown value type " + std::to_string(static_cast<uint32_t>(v.type)));
  }
  auto check_range = [&](ValueType t, const std::vector<uint64_t>& us, const std::vector<int64_t>& is) {
    for (uint64_t u : us) {
      if (!fits_unsigned(t, u)) fail(kWriterName, key, std::to_string(u) + " does not fit in " + value_type_name(t));
    }
    for (int64_t i : is) {
      if (!fits_signed(t, i)) fail(kWriterName, key, std::to_string(i) + " does not fit in " + value_type_name(t));
    }
  };
  if (v.type != ValueType::ARRAY) {
    check_range(v.type, {v.u}, {v.i});
    return;
  }
  if (!is_known_value_type(static_cast<uint32_t>(v.element_type))) {
    fail(kWriterName, key, "unknown array element type " + std::to_string(static_cast<uint32_t>(v.element_type)));
  }
  if (v.element_type == ValueType::ARRAY) fail(kWriterName, key, "nested arrays are not supported");
  check_range(v.element_type, v.array_u, v.array_i);
}

void check_alignment(std::string_view where, uint32_t alignment) {
  if (alignment == 0 || !std::has_single_bit(alignment)) {
    fail(where, "alignment", std::to_string(alignment) + " is not a power of two");
  }
}

std::string size_text(const TensorInfo& t) {
  return "shape " + shape_string(t.ne, t.n_dims) + " of " + tensor_type_name(t.type) + " needs " +
         std::to_string(t.nbytes) + " bytes";
}

// What a declared tensor's producer writes to: the output file, up to the tensor's size.
class BoundedTensorSink final : public TensorSink {
 public:
  BoundedTensorSink(OutputFile& out, const TensorInfo& tensor) : out_(out), tensor_(tensor) {}

  void write(const void* data, size_t nbytes) override {
    if (nbytes > tensor_.nbytes - written_) {
      fail(out_.tmp_path(), "tensor " + tensor_.name,
           "producer wrote " + std::to_string(written_) + " + " + std::to_string(nbytes) + " bytes, " +
               size_text(tensor_));
    }
    if (data == nullptr && nbytes > 0) fail(out_.tmp_path(), "tensor " + tensor_.name, "producer gave no data");
    out_.put_bytes(data, nbytes);
    written_ += nbytes;
  }
  void expect_complete() const {
    if (written_ != tensor_.nbytes) {
      fail(out_.tmp_path(), "tensor " + tensor_.name,
           "producer wrote " + std::to_string(written_) + " bytes, " + size_text(tensor_));
    }
  }

 private:
  OutputFile& out_;
  const TensorInfo& tensor_;
  size_t written_ = 0;
};

// Metadata in insertion order, except that general.alignment always states the alignment actually used: a
// stored entry keeps its position but takes this value, and the key is left out when the alignment is the default.
void put_metadata(OutputFile& out, const std::vector<Writer::Entry>& entries, uint32_t alignment) {
  Value alignment_value;
  alignment_value.type = ValueType::UINT32;
  alignment_value.u = alignment;
  const bool write_alignment = alignment != kDefaultAlignment;
  bool alignment_written = false;
  for (const Writer::Entry& e : entries) {
    if (e.key == kAlignmentKey) {
      if (!write_alignment) continue;
      alignment_written = true;
      out.put_string(e.key);
      put_value(out, alignment_value);
    } else {
      out.put_string(e.key);
      put_value(out, e.value);
    }
  }
  if (write_alignment && !alignment_written) {
    out.put_string(kAlignmentKey);
    put_value(out, alignment_value);
  }
}

uint64_t count_written_keys(const std::vector<Writer::Entry>& entries, uint32_t alignment) {
  const bool has_alignment_key =
      std::any_of(entries.begin(), entries.end(), [](const Writer::Entry& e) { return e.key == kAlignmentKey; });
  return entries.size() - (has_alignment_key ? 1 : 0) + (alignment != kDefaultAlignment ? 1 : 0);
}

void put_tensor_info(OutputFile& out, const TensorInfo& t) {
  out.put_string(t.name);
  out.put<uint32_t>(t.n_dims);
  for (uint32_t d = 0; d < t.n_dims; ++d) out.put<int64_t>(t.ne[d]);
  out.put<uint32_t>(static_cast<uint32_t>(t.type));
  out.put<uint64_t>(t.offset);
}

}  // namespace

void Writer::set_value(const std::string& key, const Value& v) {
  check_value(key, v);
  for (Entry& e : entries_) {
    if (e.key == key) {
      e.value = v;  // a key set twice keeps its first position
      return;
    }
  }
  entries_.push_back({key, v});
}

void Writer::set_u32(const std::string& key, uint32_t v) {
  Value value;
  value.type = ValueType::UINT32;
  value.u = v;
  set_value(key, value);
}

void Writer::set_i32(const std::string& key, int32_t v) {
  Value value;
  value.type = ValueType::INT32;
  value.i = v;
  set_value(key, value);
}

void Writer::set_u64(const std::string& key, uint64_t v) {
  Value value;
  value.type = ValueType::UINT64;
  value.u = v;
  set_value(key, value);
}

void Writer::set_f32(const std::string& key, float v) {
  Value value;
  value.type = ValueType::FLOAT32;
  value.f = v;
  set_value(key, value);
}

void Writer::set_bool(const std::string& key, bool v) {
  Value value;
  value.type = ValueType::BOOL;
  value.u = v;
  set_value(key, value);
}

void Writer::set_string(const std::string& key, const std::string& v) {
  Value value;
  value.type = ValueType::STRING;
  value.s = v;
  set_value(key, value);
}

namespace {
Value array_of(ValueType element_type) {
  Value value;
  value.type = ValueType::ARRAY;
  value.element_type = element_type;
  return value;
}
}  // namespace

void Writer::set_array_i32(const std::string& key, const std::vector<int32_t>& v) {
  Value value = array_of(ValueType::INT32);
  value.array_i.assign(v.begin(), v.end());
  set_value(key, value);
}

void Writer::set_array_u32(const std::string& key, const std::vector<uint32_t>& v) {
  Value value = array_of(ValueType::UINT32);
  value.array_u.assign(v.begin(), v.end());
  set_value(key, value);
}

void Writer::set_array_f32(const std::string& key, const std::vector<float>& v) {
  Value value = array_of(ValueType::FLOAT32);
  value.array_f.assign(v.begin(), v.end());
  set_value(key, value);
}

void Writer::set_array_bool(const std::string& key, const std::vector<bool>& v) {
  Value value = array_of(ValueType::BOOL);
  value.array_u.assign(v.begin(), v.end());
  set_value(key, value);
}

void Writer::set_array_string(const std::string& key, const std::vector<std::string>& v) {
  Value value = array_of(ValueType::STRING);
  value.array_s = v;
  set_value(key, value);
}

TensorInfo Writer::checked_tensor_info(const std::string& name, TensorType type,
                                       const std::vector<int64_t>& ne) const {
  const std::string field = "tensor " + name;
  if (name.empty()) fail(kWriterName, "tensor", "empty tensor name");
  if (name.size() > kMaxTensorNameBytes) {
    fail(kWriterName, field, "name is " + std::to_string(name.size()) + " bytes, llama.cpp allows at most " +
                                 std::to_string(kMaxTensorNameBytes));
  }
  for (const PendingTensor& t : tensors_) {
    if (t.info.name == name) fail(kWriterName, field, "duplicate tensor name");
  }
  if (ne.empty() || ne.size() > kMaxDims) {
    fail(kWriterName, field, std::to_string(ne.size()) + " dimensions (must be 1.." + std::to_string(kMaxDims) + ")");
  }
  for (int64_t n : ne) {
    if (n <= 0) fail(kWriterName, field, "shape " + shape_string(ne.data(), ne.size()) + " has a non-positive dimension");
  }
  const TensorTypeInfo* info = tensor_type_info(static_cast<uint32_t>(type));
  if (info == nullptr) fail(kWriterName, field, "unknown tensor " + tensor_type_name(type));
  const std::optional<int64_t> elements = checked_element_count(ne.data(), ne.size());
  if (!elements) fail(kWriterName, field, "element count of shape " + shape_string(ne.data(), ne.size()) + " overflows");
  if (ne[0] % info->block_elements != 0) {
    fail(kWriterName, field, "ne[0] = " + std::to_string(ne[0]) + " is not a multiple of the " +
                                 std::string(info->name) + " block size " + std::to_string(info->block_elements));
  }
  const std::optional<size_t> nbytes = checked_tensor_bytes(*info, *elements);
  if (!nbytes) fail(kWriterName, field, "size of shape " + shape_string(ne.data(), ne.size()) + " overflows");
  TensorInfo t;
  t.name = name;
  t.n_dims = static_cast<uint32_t>(ne.size());
  std::copy(ne.begin(), ne.end(), t.ne);
  t.type = type;
  t.nbytes = *nbytes;
  return t;
}

void Writer::add_tensor(const std::string& name, TensorType type, std::vector<int64_t> ne, const void* data,
                        size_t nbytes) {
  TensorInfo info = checked_tensor_info(name, type, ne);
  if (nbytes != info.nbytes) {
    fail(kWriterName, "tensor " + name, std::to_string(nbytes) + " bytes given, " + size_text(info));
  }
  if (data == nullptr) fail(kWriterName, "tensor " + name, "no data");
  const auto* bytes = static_cast<const uint8_t*>(data);
  tensors_.push_back({std::move(info), std::vector<uint8_t>(bytes, bytes + nbytes)});
}

void Writer::declare_tensor(const std::string& name, TensorType type, std::vector<int64_t> ne) {
  tensors_.push_back({checked_tensor_info(name, type, ne), std::nullopt});
}

Writer::DataLayout Writer::data_layout(uint32_t alignment) const {
  check_alignment(kWriterName, alignment);
  DataLayout layout;
  for (const PendingTensor& t : tensors_) {
    TensorInfo info = t.info;
    info.offset = layout.nbytes;  // every tensor starts aligned, as the reader requires
    info.data = t.bytes ? t.bytes->data() : nullptr;
    layout.nbytes = align_up(info.offset + info.nbytes, alignment);
    layout.tensors.push_back(std::move(info));
  }
  return layout;
}

void Writer::write(const std::string& path, uint32_t alignment) const { write(path, nullptr, alignment); }

void Writer::write(const std::string& path, const TensorProducer& produce, uint32_t alignment) const {
  check_alignment(path, alignment);
  const DataLayout layout = data_layout(alignment);
  for (const TensorInfo& t : layout.tensors) {
    if (t.data == nullptr && !produce) fail(path, "tensor " + t.name, "declared without data, and no producer given");
  }
  OutputFile out(path);
  for (char c : kMagic) out.put<char>(c);
  out.put<uint32_t>(kWriteVersion);
  out.put<uint64_t>(tensors_.size());
  out.put<uint64_t>(count_written_keys(entries_, alignment));
  put_metadata(out, entries_, alignment);
  for (const TensorInfo& t : layout.tensors) put_tensor_info(out, t);
  if (!layout.tensors.empty()) out.pad_to(alignment);
  for (const TensorInfo& t : layout.tensors) {
    if (t.data != nullptr) {
      out.put_bytes(t.data, t.nbytes);
    } else {
      BoundedTensorSink sink(out, t);
      produce(t, sink);
      sink.expect_complete();
    }
    out.pad_to(alignment);
  }
  out.commit();
}

}  // namespace sparrow::gguf
