#include "tokenizer/vocab_tokenizer.h"

#include <algorithm>
#include <cstdlib>
#include <string>

#include "util/error.h"

namespace sparrow::tokenizer_impl {
namespace {

uint32_t attr_of_type(int32_t type) {
  switch (type) {
    case token_type::kNormal: return kAttrNormal;
    case token_type::kUnknown: return kAttrUnknown;
    case token_type::kControl: return kAttrControl;
    case token_type::kUserDefined: return kAttrUserDefined;
    case token_type::kUnused: return kAttrUnused;
    case token_type::kByte: return kAttrByte;
    default: return kAttrUndefined;
  }
}

// Texts llama.cpp treats as control tokens whatever their type (end-of-turn and fill-in-the-middle markers)...
constexpr std::string_view kControlLooking[] = {
    "<|fim_prefix|>",  "<fim-prefix>",  "<fim_prefix>",    "<｜fim▁begin｜>", "<PRE>",           "▁<PRE>",
    "<|code_prefix|>", "<|prefix|>",    "<|fim_suffix|>",  "<fim-suffix>",    "<fim_suffix>",    "<｜fim▁hole｜>",
    "<SUF>",           "▁<SUF>",        "<|code_suffix|>", "<|suffix|>",      "<|fim_middle|>",  "<fim-middle>",
    "<fim_middle>",    "<｜fim▁end｜>", "<MID>",           "▁<MID>",          "<|code_middle|>", "<|middle|>"};
// ... and those that also end generation (llama.cpp's list, which names Gemma's <end_of_turn>, <eos>, <turn|>
// and <|tool_response>).
// clang-format off
constexpr std::string_view kEndOfGeneration[] = {
    "<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>", "<|flush|>", "<|calls|>", "<end_of_turn>",
    "<|endoftext|>", "</s>", "<|eom_id|>", "<EOT>", "_<EOT>", "[EOT]", "[EOS]", "<|end_of_text|>",
    "<end_of_utterance>", "<eos>", "<turn|>", "<|tool_response>", "<｜end▁of▁sentence｜>", "[e~[",
    "<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]", "<|fim_repo|>", "<|repo_name|>", "<fim-repo>",
    "<REPO>", "<reponame>", "<|file_sep|>"};
// clang-format on

bool contains(const std::vector<int32_t>& ids, int32_t id) {
  return std::find(ids.begin(), ids.end(), id) != ids.end();
}

std::string hex_byte_token(uint8_t byte) {
  static constexpr char kHex[] = "0123456789ABCDEF";
  return std::string{'<', '0', 'x', kHex[byte >> 4], kHex[byte & 15], '>'};
}

}  // namespace

VocabTokenizer::VocabTokenizer(TokenizerVocab& vocab) : origin_(vocab.origin) {
  check_and_index_tokens(vocab);
  derive_attributes_and_end_of_generation(vocab);
  build_special_matcher();
  for (int byte = 0; byte < 256; ++byte) byte_tokens_[byte] = lookup(hex_byte_token(static_cast<uint8_t>(byte)));
  add_bos_default_ = vocab.add_bos.value_or(true);
  chat_template_ = std::move(vocab.chat_template);
}

void VocabTokenizer::check_and_index_tokens(TokenizerVocab& vocab) {
  if (vocab.tokens.empty()) throw Error(origin_ + ": tokenizer.ggml.tokens: empty vocabulary");
  if (vocab.tokens.size() > static_cast<size_t>(INT32_MAX))
    throw Error(origin_ + ": tokenizer.ggml.tokens: " + std::to_string(vocab.tokens.size()) +
                " tokens, more than int32 ids can name");
  const size_t n = vocab.tokens.size();
  if (!vocab.token_types.empty() && vocab.token_types.size() < n)
    throw Error(origin_ + ": tokenizer.ggml.token_type: " + std::to_string(vocab.token_types.size()) + " entries for " +
                std::to_string(n) + " tokens");
  token_types_ = vocab.token_types;
  token_types_.resize(n, token_type::kNormal);

  tokens_ = std::move(vocab.tokens);
  for (size_t id = 0; id < n; ++id) {
    // llama.cpp renames empty tokens so that every text names one token.
    if (tokens_[id].empty()) tokens_[id] = "[EMPTY_" + std::to_string(id) + "]";
  }
  if (const int32_t first = token_index_.build(tokens_); first >= 0)
    throw Error(origin_ + ": tokenizer.ggml.tokens: token " + std::to_string(first) + " (\"" + tokens_[first] +
                "\") appears more than once");
  ascii_pair_ids_.assign(128 * 128, -1);
  for (int first = 0; first < 128; ++first) {
    const char one[1] = {static_cast<char>(first)};
    ascii_ids_[first] = token_index_.find(std::string_view(one, 1));
    for (int second = 0; second < 128; ++second) {
      const char two[2] = {static_cast<char>(first), static_cast<char>(second)};
      ascii_pair_ids_[first * 128 + second] = token_index_.find(std::string_view(two, 2));
    }
  }

  auto checked_id = [&](const std::optional<int32_t>& id, const char* key) -> int32_t {
    if (!id) return -1;
    if (*id < 0 || static_cast<size_t>(*id) >= n)
      throw Error(origin_ + ": " + key + ": " + std::to_string(*id) + " is outside the vocabulary (" +
                  std::to_string(n) + " tokens)");
    return *id;
  };
  bos_ = checked_id(vocab.bos, "tokenizer.ggml.bos_token_id");
  eos_ = checked_id(vocab.eos, "tokenizer.ggml.eos_token_id");
  const int32_t eot = checked_id(vocab.eot, "tokenizer.ggml.eot_token_id");
  const int32_t eom = checked_id(vocab.eom, "tokenizer.ggml.eom_token_id");
  for (int32_t id : {eos_, eot, eom}) {
    if (id >= 0 && !contains(end_of_generation_, id)) end_of_generation_.push_back(id);
  }
}

void VocabTokenizer::derive_attributes_and_end_of_generation(const TokenizerVocab& vocab) {
  attrs_.resize(tokens_.size());
  for (size_t id = 0; id < tokens_.size(); ++id) attrs_[id] = attr_of_type(token_types_[id]);

  for (std::string_view text : kControlLooking) {
    if (int32_t id = lookup(text); id >= 0) attrs_[id] |= kAttrControl;
  }
  for (std::string_view text : kEndOfGeneration) {
    const int32_t id = lookup(text);
    if (id < 0) continue;
    attrs_[id] |= kAttrControl;
    if (!contains(end_of_generation_, id)) end_of_generation_.push_back(id);
  }
  // Gemma 4 (and PLaMo) have an ordinary "</s>": llama.cpp recognises such vocabularies by <|tool_response>
  // (or <|plamo:eos|>) ending generation, and gives "</s>" back its normal attribute.
  const int32_t plamo_eos = lookup("<|plamo:eos|>"), closing_s = lookup("</s>");
  const bool normal_closing_s =
      lookup("<|tool_response>") >= 0 || (plamo_eos >= 0 && contains(end_of_generation_, plamo_eos));
  if (normal_closing_s && closing_s >= 0) {
    end_of_generation_.erase(std::remove(end_of_generation_.begin(), end_of_generation_.end(), closing_s),
                             end_of_generation_.end());
    attrs_[closing_s] = kAttrNormal;
  }
  std::sort(end_of_generation_.begin(), end_of_generation_.end());
}

void VocabTokenizer::build_special_matcher() {
  std::vector<int32_t> order;
  for (size_t id = 0; id < tokens_.size(); ++id) {
    if (attrs_[id] & (kAttrControl | kAttrUserDefined | kAttrUnknown)) order.push_back(static_cast<int32_t>(id));
  }
  // Longest text first, as llama.cpp. Equal lengths keep the order std::sort leaves them in, which is what
  // llama.cpp gets from the same call on the same id-ordered input; it decides only between two equally long
  // special tokens overlapping in a text.
  std::sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return tokens_[a].size() > tokens_[b].size(); });
  std::vector<SpecialTokenMatcher::Candidate> candidates;
  candidates.reserve(order.size());
  for (int32_t id : order) {
    candidates.push_back({tokens_[id], id, (attrs_[id] & (kAttrControl | kAttrUnknown)) != 0});
  }
  special_matcher_.build(candidates);
}

std::vector<int32_t> VocabTokenizer::encode(std::string_view text, bool add_bos, bool parse_special) const {
  std::vector<int32_t> ids;
  ids.reserve(text.size() / 3 + 2);
  if (add_bos) {
    if (bos_ < 0) throw Error(origin_ + ": tokenizer.ggml.bos_token_id: missing, but a BOS token was asked for");
    ids.push_back(bos_);
  }
  bool after_special = true;
  for (const SpecialTokenMatcher::Piece& piece : special_matcher_.split(text, parse_special)) {
    if (piece.token >= 0) {
      ids.push_back(piece.token);
      after_special = true;
    } else {
      encode_plain(text.substr(piece.begin, piece.end - piece.begin), after_special, ids);
      after_special = false;
    }
  }
  return ids;
}

std::string VocabTokenizer::token_to_piece(int32_t id, bool render_special) const {
  if (id < 0 || id >= n_vocab())
    throw Error(origin_ + ": token id " + std::to_string(id) + " is outside the vocabulary (" +
                std::to_string(n_vocab()) + " tokens)");
  const uint32_t attr = attrs_[id];
  const std::string& text = tokens_[id];
  if (attr & (kAttrControl | kAttrUnknown)) return render_special ? text : std::string();
  if (attr & kAttrUserDefined) return text;  // e.g. Gemma 3's "\n\n" and runs of spaces: literal text
  if (attr & kAttrNormal) {
    std::string piece;
    piece.reserve(text.size());
    for (size_t at = 0; at < text.size();) {
      if (text.compare(at, kSpaceMarker.size(), kSpaceMarker) == 0) {
        piece += ' ';
        at += kSpaceMarker.size();
      } else {
        piece += text[at++];
      }
    }
    return piece;
  }
  if (attr & kAttrByte) {
    // "<0xXX>": the two hex digits after "<0x", read as llama.cpp does (strtol; garbage reads as 0).
    const std::string digits = text.size() >= 5 ? text.substr(3, 2) : std::string();
    return std::string(1, static_cast<char>(std::strtol(digits.c_str(), nullptr, 16)));
  }
  return std::string();  // unused and undefined tokens print nothing
}

}  // namespace sparrow::tokenizer_impl
