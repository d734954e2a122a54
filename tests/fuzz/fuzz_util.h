#pragma once
// What the libFuzzer targets share: where the project's shared/ fixtures are, the tokenizers they fuzz (built
// once per process from the Gemma 4 vocabulary fixture), and the round-trip property of tokenization.
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>

#include "gguf/gguf.h"
#include "tokenizer/tokenizer.h"

namespace sparrow::fuzz {

// $SPARROW_SHARED, else the shared/ folder beside the checkout (where CI lays it).
inline std::string shared_dir() {
  const char* env = std::getenv("SPARROW_SHARED");
  if (env != nullptr && *env != '\0') return env;
  return std::string(SPARROW_SOURCE_DIR) + "/../shared";
}

// The Gemma 4 vocabulary fixture's tokenizer.* metadata; exits with a message when the fixture is absent, since
// a fuzzer with no tokenizer would run and check nothing.
inline TokenizerVocab gemma4_vocab() {
  const std::string path = shared_dir() + "/fixtures/ggml-vocab-gemma-4.gguf";
  if (!std::filesystem::exists(path)) {
    std::fprintf(stderr, "fuzz: %s not found (set SPARROW_SHARED to the folder holding fixtures/)\n", path.c_str());
    std::exit(2);
  }
  return Tokenizer::read_vocab(*gguf::File::open(path));
}

// Gemma 4's BPE tokenizer, from the fixture as it is.
inline const Tokenizer& gemma4_tokenizer() {
  static const std::unique_ptr<Tokenizer> tokenizer = Tokenizer::from_vocab(gemma4_vocab());
  return *tokenizer;
}

// A SentencePiece (Gemma 3 style) tokenizer over the same 262144 tokens and their scores: the fixture's pieces
// are SentencePiece pieces ("▁" for spaces, <0xXX> byte tokens), so this is a full-size, real vocabulary for
// the other algorithm. No space prefix, as Gemma 3's files say.
inline const Tokenizer& sentencepiece_tokenizer() {
  static const std::unique_ptr<Tokenizer> tokenizer = [] {
    TokenizerVocab vocab = gemma4_vocab();
    vocab.model = "llama";
    vocab.merges.clear();
    vocab.add_space_prefix = false;
    return Tokenizer::from_vocab(std::move(vocab));
  }();
  return *tokenizer;
}

// Strict UTF-8: no overlong forms, surrogates or code points past U+10FFFF.
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

// A broken property is a finding: report it and abort, so libFuzzer saves the input.
[[noreturn]] inline void property_failed(const char* what) {
  std::fprintf(stderr, "fuzz: property failed: %s\n", what);
  std::abort();
}

}  // namespace sparrow::fuzz
