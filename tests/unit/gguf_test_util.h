#pragma once
// Helpers for GGUF tests: a scratch directory, and reading, patching and truncating files byte by byte so that
// malformed files can be made from a good one written by gguf::Writer.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <string_view>
#include <vector>

#include "gguf/gguf.h"
#include "scratch_dir.h"
#include "util/error.h"

namespace sparrow::gguf::test_util {

// A fresh directory in the process's scratch folder, removed with its contents when the object goes away.
class TempDir {
 public:
  TempDir() {
    static std::atomic<int> counter{0};
    path_ = testing::scratch_dir() / ("gguf-" + std::to_string(counter++));
    std::filesystem::remove_all(path_);
    std::filesystem::create_directories(path_);
  }
  ~TempDir() {
    std::error_code ignored;
    std::filesystem::remove_all(path_, ignored);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  std::string file(const std::string& name) const { return (path_ / name).string(); }

 private:
  std::filesystem::path path_;
};

inline std::vector<uint8_t> read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::vector<uint8_t>(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

inline void write_bytes(const std::string& path, const std::vector<uint8_t>& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
}

// Offset of the only occurrence of `needle` in bytes; fails the test (returns 0) if it is absent or repeated,
// so that a patch can never silently land in the wrong place.
inline size_t find_unique(const std::vector<uint8_t>& bytes, std::string_view needle) {
  auto search = [&](std::vector<uint8_t>::const_iterator from) {
    return std::search(from, bytes.end(), needle.begin(), needle.end());
  };
  auto first = search(bytes.begin());
  EXPECT_NE(first, bytes.end()) << "\"" << needle << "\" not found";
  if (first == bytes.end()) return 0;
  EXPECT_EQ(search(first + 1), bytes.end()) << "\"" << needle << "\" occurs more than once";
  return static_cast<size_t>(first - bytes.begin());
}

template <class T>
void poke(std::vector<uint8_t>& bytes, size_t offset, T value) {
  ASSERT_LE(offset + sizeof(T), bytes.size());
  std::memcpy(bytes.data() + offset, &value, sizeof(T));
}

template <class T>
T peek(const std::vector<uint8_t>& bytes, size_t offset) {
  T value{};
  EXPECT_LE(offset + sizeof(T), bytes.size());
  if (offset + sizeof(T) <= bytes.size()) std::memcpy(&value, bytes.data() + offset, sizeof(T));
  return value;
}

// Opens `path` expecting sparrow::Error with one line "<path>: <field>: ..." that contains `detail`.
inline void expect_open_error(const std::string& path, const std::string& field, const std::string& detail) {
  try {
    File::open(path);
    ADD_FAILURE() << "opening " << path << " succeeded, expected an error about " << field;
  } catch (const Error& e) {
    const std::string message = e.what();
    EXPECT_EQ(message.rfind(path + ": " + field + ": ", 0), 0u) << "message: " << message;
    EXPECT_NE(message.find(detail), std::string::npos) << "message: " << message;
    EXPECT_EQ(message.find('\n'), std::string::npos) << "message: " << message;
  }
}

}  // namespace sparrow::gguf::test_util
