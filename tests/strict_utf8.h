#pragma once
// A strict UTF-8 check for the tokenizer tests and fuzzers, written apart from src/tokenizer/utf8.h so that it
// can judge it: no overlong forms, surrogates or code points past U+10FFFF.
#include <cstddef>
#include <string_view>

namespace sparrow::testing {

inline bool is_valid_utf8(std::string_view s) {
  for (size_t i = 0; i < s.size();) {
    const auto byte = [&](size_t k) { return static_cast<unsigned char>(s[i + k]); };
    const unsigned char c = byte(0);
    const size_t n = c < 0x80 ? 1 : c >= 0xC2 && c <= 0xDF ? 2 : (c >> 4) == 0xE ? 3 : c >= 0xF0 && c <= 0xF4 ? 4 : 0;
    if (n == 0 || i + n > s.size()) return false;
    for (size_t k = 1; k < n; ++k) {
      if ((byte(k) & 0xC0) != 0x80) return false;
    }
    if ((c == 0xE0 && byte(1) < 0xA0) || (c == 0xED && byte(1) >= 0xA0) || (c == 0xF0 && byte(1) < 0x90) ||
        (c == 0xF4 && byte(1) >= 0x90))
      return false;
    i += n;
  }
  return true;
}

}  // namespace sparrow::testing
