#pragma once
// A GGUF v3 writer that streams tensor data to disk tensor by tensor, so that `sparrow mkmodel` can write a
// 31B-parameter file without holding it in memory (gguf::Writer keeps every tensor's bytes until write()).
// The header is computed up front from each tensor's type and shape; the caller then produces each tensor's
// bytes in declaration order. The file appears under its name only once complete (written as NAME.partial,
// then renamed), so an interrupted run never leaves a truncated model behind.
#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "gguf/gguf.h"
#include "gguf/tensor_types.h"
#include "util/error.h"

namespace sparrow::tools::mkmodel {

struct TensorDecl {
  std::string name;
  TensorType type = TensorType::F32;
  std::vector<int64_t> ne;  // ggml order, ne[0] fastest
  uint64_t nbytes = 0;
  uint64_t offset = 0;      // from the start of the data section
  int64_t row_length() const { return ne[0]; }
  int64_t n_rows() const {
    int64_t rows = 1;
    for (size_t i = 1; i < ne.size(); ++i) rows *= ne[i];
    return rows;
  }
};

// Receives a tensor's bytes in order, in as many pieces as the producer likes.
using ByteSink = std::function<void(const void* data, size_t n)>;
using TensorProducer = std::function<void(const TensorDecl& tensor, const ByteSink& sink)>;

class StreamingGgufWriter {
 public:
  static constexpr uint64_t kAlignment = 32;  // GGUF's default general.alignment

  void add_metadata(std::string key, gguf::Value value) { metadata_.emplace_back(std::move(key), std::move(value)); }

  void add_tensor(std::string name, TensorType type, std::vector<int64_t> ne) {
    TensorDecl t;
    t.name = std::move(name);
    t.type = type;
    t.ne = std::move(ne);
    t.nbytes = static_cast<uint64_t>(tensor_row_bytes(type, t.row_length())) * static_cast<uint64_t>(t.n_rows());
    t.offset = data_size_;
    data_size_ = align(t.offset + t.nbytes);
    tensors_.push_back(std::move(t));
  }

  const std::vector<TensorDecl>& tensors() const { return tensors_; }
  const std::vector<std::pair<std::string, gguf::Value>>& metadata() const { return metadata_; }
  uint64_t data_size() const { return data_size_; }

  void write(const std::string& path, const TensorProducer& produce) const {
    const std::string partial = path + ".partial";
    File file(partial);
    write_header(file);
    for (const TensorDecl& t : tensors_) {
      uint64_t written = 0;
      produce(t, [&](const void* data, size_t n) {
        if (written + n > t.nbytes) throw Error(partial + ": tensor " + t.name + ": producer wrote too many bytes");
        file.put(data, n);
        written += n;
      });
      if (written != t.nbytes) {
        throw Error(partial + ": tensor " + t.name + ": producer wrote " + std::to_string(written) + " bytes, expected " +
                    std::to_string(t.nbytes));
      }
      file.pad_to(align(file.position()));
    }
    file.close();
    if (std::rename(partial.c_str(), path.c_str()) != 0) {
      throw Error(path + ": cannot rename from " + partial + ": " + std::strerror(errno));
    }
  }

 private:
  static uint64_t align(uint64_t n) { return (n + kAlignment - 1) / kAlignment * kAlignment; }

  // Buffered output that removes the partial file unless close() succeeded.
  class File {
   public:
    explicit File(std::string path) : path_(std::move(path)), f_(std::fopen(path_.c_str(), "wb")) {
      if (f_ == nullptr) throw Error(path_ + ": cannot open for writing: " + std::strerror(errno));
      std::setvbuf(f_, nullptr, _IOFBF, 1 << 20);
    }
    ~File() {
      if (f_ != nullptr) {
        std::fclose(f_);
        std::remove(path_.c_str());
      }
    }
    File(const File&) = delete;
    File& operator=(const File&) = delete;

    void put(const void* data, size_t n) {
      if (n != 0 && std::fwrite(data, 1, n, f_) != n) throw Error(path_ + ": write failed: " + std::strerror(errno));
      position_ += n;
    }
    template <typename T>
    void put_scalar(T v) { put(&v, sizeof v); }  // GGUF is little-endian, as every machine Sparrow targets
    void put_string(const std::string& s) {
      put_scalar<uint64_t>(s.size());
      put(s.data(), s.size());
    }
    void pad_to(uint64_t target) {
      static const char zeros[kAlignment] = {};
      while (position_ < target) put(zeros, std::min<uint64_t>(target - position_, kAlignment));
    }
    uint64_t position() const { return position_; }
    void close() {
      FILE* f = f_;
      f_ = nullptr;
      if (std::fclose(f) != 0) {
        std::remove(path_.c_str());
        throw Error(path_ + ": close failed: " + std::strerror(errno));
      }
    }

   private:
    std::string path_;
    FILE* f_;
    uint64_t position_ = 0;
  };

  void write_header(File& file) const {
    file.put("GGUF", 4);
    file.put_scalar<uint32_t>(3);
    file.put_scalar<uint64_t>(tensors_.size());
    file.put_scalar<uint64_t>(metadata_.size());
    for (const auto& [key, value] : metadata_) {
      file.put_string(key);
      file.put_scalar<uint32_t>(static_cast<uint32_t>(value.type));
      if (value.type == gguf::ValueType::ARRAY) {
        write_array(file, key, value);
      } else {
        write_scalar(file, key, value);
      }
    }
    for (const TensorDecl& t : tensors_) {
      file.put_string(t.name);
      file.put_scalar<uint32_t>(static_cast<uint32_t>(t.ne.size()));
      for (int64_t n : t.ne) file.put_scalar<uint64_t>(static_cast<uint64_t>(n));
      file.put_scalar<uint32_t>(static_cast<uint32_t>(t.type));
      file.put_scalar<uint64_t>(t.offset);
    }
    file.pad_to(align(file.position()));
  }

  static void write_scalar(File& file, const std::string& key, const gguf::Value& v) {
    using VT = gguf::ValueType;
    switch (v.type) {
      case VT::UINT8: return file.put_scalar<uint8_t>(static_cast<uint8_t>(v.u));
      case VT::INT8: return file.put_scalar<int8_t>(static_cast<int8_t>(v.i));
      case VT::UINT16: return file.put_scalar<uint16_t>(static_cast<uint16_t>(v.u));
      case VT::INT16: return file.put_scalar<int16_t>(static_cast<int16_t>(v.i));
      case VT::UINT32: return file.put_scalar<uint32_t>(static_cast<uint32_t>(v.u));
      case VT::INT32: return file.put_scalar<int32_t>(static_cast<int32_t>(v.i));
      case VT::UINT64: return file.put_scalar<uint64_t>(v.u);
      case VT::INT64: return file.put_scalar<int64_t>(v.i);
      case VT::FLOAT32: return file.put_scalar<float>(static_cast<float>(v.f));
      case VT::FLOAT64: return file.put_scalar<double>(v.f);
      case VT::BOOL: return file.put_scalar<uint8_t>(v.u != 0 ? 1 : 0);
      case VT::STRING: return file.put_string(v.s);
      case VT::ARRAY: break;
    }
    throw Error("metadata " + key + ": cannot write value type " + std::to_string(static_cast<uint32_t>(v.type)));
  }

  static void write_array(File& file, const std::string& key, const gguf::Value& v) {
    using VT = gguf::ValueType;
    file.put_scalar<uint32_t>(static_cast<uint32_t>(v.element_type));
    file.put_scalar<uint64_t>(v.array_size());
    switch (v.element_type) {
      case VT::UINT8: for (uint64_t x : v.array_u) file.put_scalar<uint8_t>(static_cast<uint8_t>(x)); return;
      case VT::UINT16: for (uint64_t x : v.array_u) file.put_scalar<uint16_t>(static_cast<uint16_t>(x)); return;
      case VT::UINT32: for (uint64_t x : v.array_u) file.put_scalar<uint32_t>(static_cast<uint32_t>(x)); return;
      case VT::UINT64: for (uint64_t x : v.array_u) file.put_scalar<uint64_t>(x); return;
      case VT::BOOL: for (uint64_t x : v.array_u) file.put_scalar<uint8_t>(x != 0 ? 1 : 0); return;
      case VT::INT8: for (int64_t x : v.array_i) file.put_scalar<int8_t>(static_cast<int8_t>(x)); return;
      case VT::INT16: for (int64_t x : v.array_i) file.put_scalar<int16_t>(static_cast<int16_t>(x)); return;
      case VT::INT32: for (int64_t x : v.array_i) file.put_scalar<int32_t>(static_cast<int32_t>(x)); return;
      case VT::INT64: for (int64_t x : v.array_i) file.put_scalar<int64_t>(x); return;
      case VT::FLOAT32: for (double x : v.array_f) file.put_scalar<float>(static_cast<float>(x)); return;
      case VT::FLOAT64: for (double x : v.array_f) file.put_scalar<double>(x); return;
      case VT::STRING: for (const std::string& s : v.array_s) file.put_string(s); return;
      case VT::ARRAY: break;
    }
    throw Error("metadata " + key + ": cannot write arrays of value type " +
                std::to_string(static_cast<uint32_t>(v.element_type)));
  }

  std::vector<std::pair<std::string, gguf::Value>> metadata_;
  std::vector<TensorDecl> tensors_;
  uint64_t data_size_ = 0;
};

}  // namespace sparrow::tools::mkmodel
