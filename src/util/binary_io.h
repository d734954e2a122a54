#pragma once
// Little-endian binary values on streams, for Sparrow's own small file formats (saved sequence state). A short
// read throws sparrow::Error naming what was being read, so a truncated file is an error, never garbage.
#include <bit>
#include <cstdint>
#include <istream>
#include <ostream>
#include <string>
#include <type_traits>

#include "util/error.h"

namespace sparrow::binary {

static_assert(std::endian::native == std::endian::little, "Sparrow's files are little-endian, as is its host");

inline void write_bytes(std::ostream& out, const void* data, size_t n) {
  out.write(static_cast<const char*>(data), std::streamsize(n));
}

template <typename T>
void write(std::ostream& out, T value) {
  static_assert(std::is_trivially_copyable_v<T>);
  write_bytes(out, &value, sizeof value);
}

inline void write_string(std::ostream& out, const std::string& s) {
  write(out, uint32_t(s.size()));
  write_bytes(out, s.data(), s.size());
}

inline void read_bytes(std::istream& in, void* data, size_t n, const char* what) {
  in.read(static_cast<char*>(data), std::streamsize(n));
  if (size_t(in.gcount()) != n) throw Error(std::string("file ends inside ") + what);
}

template <typename T>
T read(std::istream& in, const char* what) {
  static_assert(std::is_trivially_copyable_v<T>);
  T value;
  read_bytes(in, &value, sizeof value, what);
  return value;
}

// At most max_size bytes: a corrupt length is an error, not a huge allocation.
inline std::string read_string(std::istream& in, const char* what, uint32_t max_size = 256) {
  const auto n = read<uint32_t>(in, what);
  if (n > max_size) throw Error(std::string(what) + " is " + std::to_string(n) + " bytes long (corrupt file)");
  std::string s(n, '\0');
  read_bytes(in, s.data(), n, what);
  return s;
}

}  // namespace sparrow::binary
