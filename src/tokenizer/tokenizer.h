#pragma once
// Tokenizers built from GGUF metadata: Gemma 3's SentencePiece (tokenizer.ggml.model = "llama") and Gemma 4's
// BPE (tokenizer.ggml.model = "gemma4"). Token ids equal llama.cpp's.
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "gguf/gguf.h"

namespace sparrow {

// llama.cpp's token types (tokenizer.ggml.token_type).
namespace token_type {
constexpr int32_t kUndefined = 0, kNormal = 1, kUnknown = 2, kControl = 3, kUserDefined = 4, kUnused = 5, kByte = 6;
}

// The tokenizer.* metadata of a GGUF file as plain values, so a tokenizer can be built from a file or, in
// tests, by hand. Fields left empty take llama.cpp's defaults for the tokenizer model.
struct TokenizerVocab {
  std::string origin = "<vocab>";             // names the source (the GGUF path) in error messages
  std::string model;                          // tokenizer.ggml.model: "llama" (SentencePiece) or "gemma4" (BPE)
  std::vector<std::string> tokens;            // tokenizer.ggml.tokens; a token's id is its index
  std::vector<float> scores;                  // tokenizer.ggml.scores (SentencePiece merge priority); empty: all 0
  std::vector<int32_t> token_types;           // tokenizer.ggml.token_type (token_type::k*); empty: all normal
  std::vector<std::string> merges;            // tokenizer.ggml.merges, "left right"; rank = index (BPE only)
  std::optional<int32_t> bos, eos, eot, eom;  // tokenizer.ggml.{bos,eos,eot,eom}_token_id
  std::optional<bool> add_bos;                // tokenizer.ggml.add_bos_token
  std::optional<bool> add_space_prefix;       // tokenizer.ggml.add_space_prefix (SentencePiece only)
  std::string chat_template;                  // tokenizer.chat_template
};

class Tokenizer {
 public:
  // Throws sparrow::Error naming the file and key if the tokenizer metadata is missing or inconsistent.
  static std::unique_ptr<Tokenizer> from_gguf(const gguf::File& file);
  // Same checks and behaviour as from_gguf, from metadata already in memory (tests build vocabularies by hand).
  static std::unique_ptr<Tokenizer> from_vocab(TokenizerVocab vocab);
  // The tokenizer.* keys of a GGUF file; throws sparrow::Error "<path>: <key>: ..." on a missing or mistyped key.
  static TokenizerVocab read_vocab(const gguf::File& file);
  virtual ~Tokenizer() = default;
  Tokenizer(const Tokenizer&) = delete;
  Tokenizer& operator=(const Tokenizer&) = delete;

  // parse_special: text like "<start_of_turn>" becomes its special (control / user-defined) token, as
  // llama.cpp's llama_tokenize(..., parse_special=true). add_bos follows the caller, not the file.
  virtual std::vector<int32_t> encode(std::string_view text, bool add_bos, bool parse_special) const = 0;
  // The bytes a token stands for (spaces restored, byte tokens as their byte; control tokens as "" unless
  // render_special). Concatenating pieces of a sequence gives its text.
  virtual std::string token_to_piece(int32_t id, bool render_special = false) const = 0;
  std::string decode(const std::vector<int32_t>& ids, bool render_special = false) const;

  int32_t n_vocab() const { return static_cast<int32_t>(tokens_.size()); }
  int32_t bos() const { return bos_; }
  int32_t eos() const { return eos_; }  // -1 if the vocabulary has none
  bool add_bos_default() const { return add_bos_default_; }
  bool is_end_of_generation(int32_t id) const;  // eos, eot, and any id in the file's end-of-generation set
  std::optional<int32_t> find_token(std::string_view text) const;
  const std::string& token_text(int32_t id) const { return tokens_.at(id); }
  // The chat template text from tokenizer.chat_template, or "" if absent.
  const std::string& chat_template() const { return chat_template_; }

 protected:
  Tokenizer() = default;
  virtual int32_t id_of_text(std::string_view text) const = 0;  // -1 if no token has this text
  std::vector<std::string> tokens_;
  std::vector<int32_t> token_types_;  // llama.cpp's token types: 1 normal, 2 unknown, 3 control, 4 user, 6 byte
  int32_t bos_ = -1;
  int32_t eos_ = -1;
  bool add_bos_default_ = true;
  std::vector<int32_t> end_of_generation_;
  std::string chat_template_;
};

}  // namespace sparrow
