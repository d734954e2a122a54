#pragma once
// UTF-8 as llama.cpp's tokenizers read it (private to src/tokenizer/). Their quirks decide token ids for
// malformed text, so they are kept: a stray continuation byte counts as a one-byte character, and the BPE
// path replaces each undecodable byte by U+FFFD.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace sparrow::tokenizer_impl {

// Bytes in the character a lead byte announces, judged from its high 4 bits only (llama.cpp's
// unicode_len_utf8): 0xxx and 10xx -> 1, 110x -> 2, 1110 -> 3, 1111 -> 4.
inline size_t utf8_sequence_length(char lead) {
  static constexpr uint8_t kLength[16] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 3, 4};
  return kLength[static_cast<uint8_t>(lead) >> 4];
}

// Appends text with every ' ' spelled U+2581 ("▁"), as SentencePiece vocabularies spell spaces.
inline void append_with_space_markers(std::string_view text, std::string& out) {
  for (char c : text) {
    if (c == ' ') {
      out += "\xE2\x96\x81";
    } else {
      out += c;
    }
  }
}

// Appends the UTF-8 of one code point; code points past U+10FFFF (which llama.cpp fails on) become U+FFFD.
inline void append_code_point(uint32_t cp, std::string& out) {
  if (cp <= 0x7F) {
    out += static_cast<char>(cp);
  } else if (cp <= 0x7FF) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp <= 0xFFFF) {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp <= 0x10FFFF) {
    out += static_cast<char>(0xF0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += "\xEF\xBF\xBD";
  }
}

// Decodes the code point at text[at] the way llama.cpp's unicode_cpt_from_utf8 does (lead byte and
// continuation bits checked; overlong forms and surrogates accepted) and advances `at`. Undecodable: U+FFFD,
// advancing one byte.
inline uint32_t decode_code_point(std::string_view text, size_t& at) {
  auto continuation = [&](size_t k) {
    return at + k < text.size() && (static_cast<uint8_t>(text[at + k]) & 0xC0) == 0x80;
  };
  auto bits = [&](size_t k) { return static_cast<uint32_t>(static_cast<uint8_t>(text[at + k]) & 0x3F); };
  const uint8_t lead = static_cast<uint8_t>(text[at]);
  uint32_t cp;
  if (lead < 0x80) {
    cp = lead;
    at += 1;
  } else if ((lead & 0x40) == 0) {
    cp = 0xFFFD;
    at += 1;
  } else if ((lead & 0x20) == 0) {
    if (!continuation(1)) return ++at, 0xFFFD;
    cp = ((lead & 0x1Fu) << 6) | bits(1);
    at += 2;
  } else if ((lead & 0x10) == 0) {
    if (!continuation(1) || !continuation(2)) return ++at, 0xFFFD;
    cp = ((lead & 0x0Fu) << 12) | (bits(1) << 6) | bits(2);
    at += 3;
  } else if ((lead & 0x08) == 0) {
    if (!continuation(1) || !continuation(2) || !continuation(3)) return ++at, 0xFFFD;
    cp = ((lead & 0x07u) << 18) | (bits(1) << 12) | (bits(2) << 6) | bits(3);
    at += 4;
  } else {
    cp = 0xFFFD;
    at += 1;
  }
  return cp;
}

}  // namespace sparrow::tokenizer_impl
