#pragma once
// GGUF v3 (also reads v2): read through mmap with zero-copy tensor data, and write, tensor data streamed if need be.
// Every malformed input raises sparrow::Error with a one-line message "<path>: <field>: <what is wrong>".
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "gguf/tensor_types.h"

namespace sparrow::gguf {

enum class ValueType : uint32_t {
  UINT8 = 0, INT8 = 1, UINT16 = 2, INT16 = 3, UINT32 = 4, INT32 = 5, FLOAT32 = 6, BOOL = 7,
  STRING = 8, ARRAY = 9, UINT64 = 10, INT64 = 11, FLOAT64 = 12,
};

// One metadata value. Scalars keep their exact type; arrays keep their element type and store elements
// in the widest matching C++ type (integers as int64_t/uint64_t, floats as double).
struct Value {
  ValueType type = ValueType::UINT32;
  ValueType element_type = ValueType::UINT32;  // arrays only
  uint64_t u = 0;        // unsigned integer scalars and BOOL
  int64_t i = 0;         // signed integer scalars
  double f = 0;          // FLOAT32/FLOAT64 scalars
  std::string s;         // STRING scalar
  std::vector<uint64_t> array_u;          // UINT*/BOOL arrays
  std::vector<int64_t> array_i;           // INT* arrays
  std::vector<double> array_f;            // FLOAT* arrays
  std::vector<std::string> array_s;       // STRING arrays
  size_t array_size() const;
};

struct TensorInfo {
  std::string name;
  uint32_t n_dims = 0;
  int64_t ne[4] = {1, 1, 1, 1};  // ggml order: ne[0] fastest
  TensorType type = TensorType::F32;
  uint64_t offset = 0;           // from the start of the data section
  const void* data = nullptr;    // points into the mapping (reader) or the writer's copy (Writer::data_layout)
  size_t nbytes = 0;
  int64_t n_elements() const { return ne[0] * ne[1] * ne[2] * ne[3]; }
};

class File {
 public:
  // Opens and validates the whole header (counts, strings, types, offsets, sizes, alignment).
  static std::unique_ptr<File> open(const std::string& path);
  ~File();
  File(const File&) = delete;
  File& operator=(const File&) = delete;

  const std::string& path() const { return path_; }
  uint32_t version() const { return version_; }
  size_t alignment() const { return alignment_; }

  const std::map<std::string, Value, std::less<>>& metadata() const { return metadata_; }
  const Value* find(std::string_view key) const;
  bool has(std::string_view key) const { return find(key) != nullptr; }

  // Typed getters. The required forms throw "<path>: <key>: missing" or "...: expected <type>, found <type>".
  // Integer getters accept any integer type (and check range); float getters accept FLOAT32/FLOAT64.
  uint64_t get_uint(std::string_view key) const;
  std::optional<uint64_t> get_uint_opt(std::string_view key) const;
  double get_float(std::string_view key) const;
  std::optional<double> get_float_opt(std::string_view key) const;
  bool get_bool(std::string_view key) const;
  std::string get_string(std::string_view key) const;
  std::optional<std::string> get_string_opt(std::string_view key) const;
  std::vector<int64_t> get_int_array(std::string_view key) const;     // any integer (or bool) element type
  std::vector<double> get_float_array(std::string_view key) const;
  const std::vector<std::string>& get_string_array(std::string_view key) const;
  std::vector<bool> get_bool_array(std::string_view key) const;

  const std::vector<TensorInfo>& tensors() const { return tensors_; }
  const TensorInfo* find_tensor(std::string_view name) const;
  // Like find_tensor, but throws "<path>: tensor <name>: missing" when absent.
  const TensorInfo& tensor(std::string_view name) const;
  // Throws "<path>: tensor <name>: shape {a,b} expected {c,d}" unless the shape matches (trailing 1s ignored).
  void expect_shape(const TensorInfo& t, std::initializer_list<int64_t> ne) const;

 private:
  File() = default;
  std::string path_;
  uint32_t version_ = 0;
  size_t alignment_ = 32;
  std::map<std::string, Value, std::less<>> metadata_;
  std::vector<TensorInfo> tensors_;
  std::map<std::string, size_t, std::less<>> tensor_index_;
  void* mapping_ = nullptr;
  size_t mapping_size_ = 0;
};

// Receives the bytes of one tensor declared without data (Writer::declare_tensor) while Writer::write runs, in as
// many pieces as the producer likes. The writer owns it: it refuses bytes past the tensor's size, checks after the
// producer returns that the whole size arrived, and pads to the alignment itself.
class TensorSink {
 public:
  virtual void write(const void* data, size_t nbytes) = 0;

 protected:
  ~TensorSink() = default;
};

// Writes the tensor.nbytes bytes of a declared tensor to the sink; tensor.offset is that of the file being written.
using TensorProducer = std::function<void(const TensorInfo& tensor, TensorSink& sink)>;

// Builds a GGUF v3 file: metadata in insertion order, then tensor infos, then aligned data. A tensor's bytes are
// either copied in (add_tensor) or produced while the file is written (declare_tensor), so that a file larger
// than memory can be written a piece at a time.
class Writer {
 public:
  struct Entry {
    std::string key;
    Value value;
  };
  // The data section as write() lays it out: every tensor's info, with its offset for the alignment and `data`
  // pointing at the writer's copy (null for a declared tensor), and the section's size in bytes.
  struct DataLayout {
    std::vector<TensorInfo> tensors;
    uint64_t nbytes = 0;
  };

  void set_u32(const std::string& key, uint32_t v);
  void set_i32(const std::string& key, int32_t v);
  void set_u64(const std::string& key, uint64_t v);
  void set_f32(const std::string& key, float v);
  void set_bool(const std::string& key, bool v);
  void set_string(const std::string& key, const std::string& v);
  void set_value(const std::string& key, const Value& v);  // any type, arrays included (copying a file's keys)
  void set_array_i32(const std::string& key, const std::vector<int32_t>& v);
  void set_array_u32(const std::string& key, const std::vector<uint32_t>& v);
  void set_array_f32(const std::string& key, const std::vector<float>& v);
  void set_array_bool(const std::string& key, const std::vector<bool>& v);
  void set_array_string(const std::string& key, const std::vector<std::string>& v);
  // Adds a tensor; the bytes are copied. ne in ggml order; nbytes must equal the size its type implies.
  void add_tensor(const std::string& name, TensorType type, std::vector<int64_t> ne, const void* data,
                  size_t nbytes);
  // Adds a tensor whose bytes a TensorProducer writes during write(); checked like add_tensor.
  void declare_tensor(const std::string& name, TensorType type, std::vector<int64_t> ne);

  // The keys as set, in insertion order (general.alignment as stored: write() states the alignment it uses).
  const std::vector<Entry>& metadata() const { return entries_; }
  DataLayout data_layout(uint32_t alignment = 32) const;

  // Writes to path + ".tmp", then renames, so that a failed write never leaves a partial file at `path`.
  // `alignment` (a power of two) decides general.alignment: the key is written (as uint32) only when it is not
  // 32, whatever value set_* stored for it. `produce` is called for each declared tensor, in the order they were
  // added; a writer with declared tensors needs it.
  void write(const std::string& path, uint32_t alignment = 32) const;
  void write(const std::string& path, const TensorProducer& produce, uint32_t alignment = 32) const;

 private:
  struct PendingTensor {
    TensorInfo info;                            // data and offset are set by data_layout()
    std::optional<std::vector<uint8_t>> bytes;  // absent for a declared tensor
  };
  TensorInfo checked_tensor_info(const std::string& name, TensorType type, const std::vector<int64_t>& ne) const;
  std::vector<Entry> entries_;
  std::vector<PendingTensor> tensors_;
};

}  // namespace sparrow::gguf
