#include "tokenizer/tokenizer.h"

#include <algorithm>

#include "tokenizer/vocab_tokenizer.h"
#include "util/error.h"

namespace sparrow {
namespace {

bool is_signed_integer(gguf::ValueType t) {
  return t == gguf::ValueType::INT8 || t == gguf::ValueType::INT16 || t == gguf::ValueType::INT32 ||
         t == gguf::ValueType::INT64;
}

// A token id key. Some converters write -1 (as a signed integer) for "none"; that reads as absent.
std::optional<int32_t> read_token_id(const gguf::File& file, std::string_view key) {
  const gguf::Value* value = file.find(key);
  if (value == nullptr) return std::nullopt;
  if (is_signed_integer(value->type) && value->i < 0) return std::nullopt;
  const uint64_t id = file.get_uint(key);
  if (id > static_cast<uint64_t>(INT32_MAX))
    throw Error(file.path() + ": " + std::string(key) + ": " + std::to_string(id) + " is not a token id");
  return static_cast<int32_t>(id);
}

std::optional<bool> read_bool(const gguf::File& file, std::string_view key) {
  if (!file.has(key)) return std::nullopt;
  return file.get_bool(key);
}

}  // namespace

TokenizerVocab Tokenizer::read_vocab(const gguf::File& file) {
  TokenizerVocab vocab;
  vocab.origin = file.path();
  vocab.model = file.get_string("tokenizer.ggml.model");
  vocab.tokens = file.get_string_array("tokenizer.ggml.tokens");

  // Scores may be float or (llama.cpp accepts it) integer arrays.
  if (const gguf::Value* scores = file.find("tokenizer.ggml.scores")) {
    const bool integer = scores->type == gguf::ValueType::ARRAY && scores->element_type != gguf::ValueType::FLOAT32 &&
                         scores->element_type != gguf::ValueType::FLOAT64;
    if (integer) {
      for (int64_t s : file.get_int_array("tokenizer.ggml.scores")) vocab.scores.push_back(static_cast<float>(s));
    } else {
      for (double s : file.get_float_array("tokenizer.ggml.scores")) vocab.scores.push_back(static_cast<float>(s));
    }
  }
  if (file.has("tokenizer.ggml.token_type")) {
    for (int64_t t : file.get_int_array("tokenizer.ggml.token_type"))
      vocab.token_types.push_back(static_cast<int32_t>(t));
  }
  if (file.has("tokenizer.ggml.merges")) vocab.merges = file.get_string_array("tokenizer.ggml.merges");

  vocab.bos = read_token_id(file, "tokenizer.ggml.bos_token_id");
  vocab.eos = read_token_id(file, "tokenizer.ggml.eos_token_id");
  vocab.eot = read_token_id(file, "tokenizer.ggml.eot_token_id");
  vocab.eom = read_token_id(file, "tokenizer.ggml.eom_token_id");
  vocab.add_bos = read_bool(file, "tokenizer.ggml.add_bos_token");
  vocab.add_space_prefix = read_bool(file, "tokenizer.ggml.add_space_prefix");
  vocab.chat_template = file.get_string_opt("tokenizer.chat_template").value_or("");
  return vocab;
}

std::unique_ptr<Tokenizer> Tokenizer::from_gguf(const gguf::File& file) { return from_vocab(read_vocab(file)); }

std::unique_ptr<Tokenizer> Tokenizer::from_vocab(TokenizerVocab vocab) {
  if (vocab.model == "llama") {
    // llama.cpp's SentencePiece defaults, which a file's keys override.
    if (!vocab.bos && vocab.tokens.size() > 1) vocab.bos = 1;
    if (!vocab.eos && vocab.tokens.size() > 2) vocab.eos = 2;
    return std::make_unique<tokenizer_impl::SentencePieceTokenizer>(vocab);
  }
  if (vocab.model == "gemma4") return std::make_unique<tokenizer_impl::Gemma4BpeTokenizer>(vocab);
  throw Error(vocab.origin + ": tokenizer.ggml.model: \"" + vocab.model +
              "\" is not supported (expected \"llama\" for Gemma 3 or \"gemma4\" for Gemma 4)");
}

std::string Tokenizer::decode(const std::vector<int32_t>& ids, bool render_special) const {
  std::string text;
  for (int32_t id : ids) text += token_to_piece(id, render_special);
  return text;
}

bool Tokenizer::is_end_of_generation(int32_t id) const {
  return std::binary_search(end_of_generation_.begin(), end_of_generation_.end(), id);
}

std::optional<int32_t> Tokenizer::find_token(std::string_view text) const {
  const int32_t id = id_of_text(text);
  if (id < 0) return std::nullopt;
  return id;
}

}  // namespace sparrow
