#pragma once
// The machinery both Gemma tokenizers share (private to src/tokenizer/): token attributes, the split of a text
// around special tokens, byte fallback and token_to_piece. Each model contributes only how a run of plain
// text becomes ids (SentencePiece merges for Gemma 3, BPE merges for Gemma 4).
#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "tokenizer/flat_tables.h"
#include "tokenizer/special_tokens.h"
#include "tokenizer/tokenizer.h"

namespace sparrow::tokenizer_impl {

// llama.cpp's token attributes. A token type maps to one of them; llama.cpp then adds kControl to tokens whose
// text marks an end of turn (e.g. "<|tool_response>", user-defined in Gemma 4), which changes how they parse
// and print, so attributes, not types, decide behaviour here.
enum TokenAttr : uint32_t {
  kAttrUndefined = 0,
  kAttrUnknown = 1u << 0,
  kAttrUnused = 1u << 1,
  kAttrNormal = 1u << 2,
  kAttrControl = 1u << 3,
  kAttrUserDefined = 1u << 4,
  kAttrByte = 1u << 5,
};

// "\xE2\x96\x81" (U+2581, "▁"): how SentencePiece-style vocabularies spell a space.
inline constexpr std::string_view kSpaceMarker = "\xE2\x96\x81";

class VocabTokenizer : public Tokenizer {
 public:
  // Validates the vocabulary and builds the lookup tables; throws sparrow::Error "<origin>: <key>: ...".
  explicit VocabTokenizer(TokenizerVocab& vocab);

  std::vector<int32_t> encode(std::string_view text, bool add_bos, bool parse_special) const override;
  std::string token_to_piece(int32_t id, bool render_special) const override;

 protected:
  // Appends the ids of a run of text that holds no special token. after_special: the run starts the text or
  // follows a special token (SentencePiece's add_space_prefix looks at it).
  virtual void encode_plain(std::string_view text, bool after_special, std::vector<int32_t>& out) const = 0;

  int32_t id_of_text(std::string_view text) const override { return lookup(text); }
  // The id of the token with this text, or -1.
  int32_t lookup(std::string_view text) const {
    if (text.size() <= 2 && is_ascii(text)) {
      const auto byte = [&](size_t k) { return static_cast<uint8_t>(text[k]); };
      if (text.size() == 1) return ascii_ids_[byte(0)];
      if (text.size() == 2) return ascii_pair_ids_[byte(0) * 128 + byte(1)];
    }
    return token_index_.find(text);
  }
  static bool is_ascii(std::string_view text) {
    for (char c : text) {
      if (static_cast<uint8_t>(c) >= 128) return false;
    }
    return true;
  }
  // The <0xXX> token of a byte, or -1 when the vocabulary has none.
  int32_t byte_token(uint8_t byte) const { return byte_tokens_[byte]; }
  const std::string& origin() const { return origin_; }

 private:
  void check_and_index_tokens(TokenizerVocab& vocab);
  void derive_attributes_and_end_of_generation(const TokenizerVocab& vocab);
  void build_special_matcher();

  std::string origin_;
  TokenIndex token_index_;  // over tokens_, which never change after construction
  // lookup() of one and two ASCII bytes from small tables: most lookups in English text, and each probe of the
  // big index costs a cache miss or two.
  std::array<int32_t, 128> ascii_ids_{};
  std::vector<int32_t> ascii_pair_ids_;  // [first * 128 + second]
  std::vector<uint32_t> attrs_;          // TokenAttr bits per id
  std::array<int32_t, 256> byte_tokens_{};
  SpecialTokenMatcher special_matcher_;
};

// Gemma 3 (tokenizer.ggml.model = "llama"): SentencePiece. Merges the adjacent pair whose joined text is the
// highest-scoring token until none is left; what is not a token falls back to <0xXX> byte tokens.
class SentencePieceTokenizer final : public VocabTokenizer {
 public:
  explicit SentencePieceTokenizer(TokenizerVocab& vocab);

 protected:
  void encode_plain(std::string_view text, bool after_special, std::vector<int32_t>& out) const override;

 private:
  std::vector<float> scores_;
  bool add_space_prefix_ = true;
};

// Gemma 4 (tokenizer.ggml.model = "gemma4"): BPE over UTF-8 code points with spaces spelled "▁", split into
// runs of newlines and runs of anything else, merging the lowest-ranked pair first; <0xXX> byte fallback.
class Gemma4BpeTokenizer final : public VocabTokenizer {
 public:
  explicit Gemma4BpeTokenizer(TokenizerVocab& vocab);

 protected:
  void encode_plain(std::string_view text, bool after_special, std::vector<int32_t>& out) const override;

 private:
  struct Symbol;
  MergeTable::Merge find_merge(const Symbol& left, const Symbol& right, std::string_view word) const;
  void encode_word(std::string_view word, std::vector<Symbol>& symbols, std::vector<int32_t>& out) const;

  // Merges keyed by the ids of both halves (every merge of real vocabularies joins two tokens) ...
  MergeTable merges_by_ids_;
  std::vector<int32_t> ascii_merge_ranks_;  // [first * 128 + second]: ranks of merges of two ASCII characters
  // ... and, for merges naming a string that is not a token, by "left right".
  std::unordered_map<std::string, MergeTable::Merge> merges_by_text_;
};

}  // namespace sparrow::tokenizer_impl
