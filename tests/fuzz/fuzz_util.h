#pragma once
// What the libFuzzer targets share: where the project's shared/ fixtures are, the tokenizers they fuzz (built
// once per process from the Gemma 4 vocabulary fixture), and the round-trip property of tokenization.
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>

#include "gguf/gguf.h"
#include "strict_utf8.h"
#include "tokenizer/tokenizer.h"

namespace sparrow::fuzz {

using sparrow::testing::is_valid_utf8;

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

// A broken property is a finding: report it and abort, so libFuzzer saves the input.
[[noreturn]] inline void property_failed(const char* what) {
  std::fprintf(stderr, "fuzz: property failed: %s\n", what);
  std::abort();
}

}  // namespace sparrow::fuzz
