// Gemma 3's SentencePiece tokenizer, with the ids of llama.cpp's llm_tokenizer_spm: the text (spaces spelled
// "▁") starts as one symbol per UTF-8 character; repeatedly the adjacent pair whose joined text is the
// highest-scoring token is merged (ties: leftmost); symbols that are not tokens become <0xXX> byte tokens.
#include <queue>
#include <string>
#include <vector>

#include "tokenizer/utf8.h"
#include "tokenizer/vocab_tokenizer.h"
#include "util/error.h"

namespace sparrow::tokenizer_impl {
namespace {

struct Symbol {
  int32_t prev, next;    // neighbours in the list of live symbols, -1 at the ends
  uint32_t begin, size;  // bytes of the text; size 0 once merged into the symbol on its left
};

// A candidate merge of symbol `left` with its right neighbour, valid while both keep the sizes they had.
struct Bigram {
  float score;
  int32_t left, right;
  uint32_t size;  // bytes of the joined text
};

// Highest score first; among equal scores the leftmost pair (llama.cpp's order, which decides the ids).
struct BigramOrder {
  bool operator()(const Bigram& a, const Bigram& b) const {
    return a.score < b.score || (a.score == b.score && a.left > b.left);
  }
};

}  // namespace

SentencePieceTokenizer::SentencePieceTokenizer(TokenizerVocab& vocab) : VocabTokenizer(vocab) {
  if (!vocab.scores.empty() && vocab.scores.size() < tokens_.size())
    throw Error(origin() + ": tokenizer.ggml.scores: " + std::to_string(vocab.scores.size()) + " scores for " +
                std::to_string(tokens_.size()) + " tokens");
  scores_ = std::move(vocab.scores);
  scores_.resize(tokens_.size(), 0.0f);
  add_space_prefix_ = vocab.add_space_prefix.value_or(true);  // llama.cpp's default; Gemma's files say false
}

void SentencePieceTokenizer::encode_plain(std::string_view raw, bool after_special, std::vector<int32_t>& out) const {
  std::string text;
  text.reserve(raw.size() + raw.size() / 4 + 3);
  if (add_space_prefix_ && after_special) text += kSpaceMarker;
  append_with_space_markers(raw, text);
  if (text.size() > static_cast<size_t>(INT32_MAX))
    throw Error(origin() + ": text run of " + std::to_string(text.size()) + " bytes is too long to tokenize");

  std::vector<Symbol> symbols;
  symbols.reserve(text.size());
  for (uint32_t at = 0; at < text.size();) {
    const uint32_t size = static_cast<uint32_t>(std::min(utf8_sequence_length(text[at]), text.size() - at));
    const int32_t index = static_cast<int32_t>(symbols.size());
    symbols.push_back({index - 1, at + size == text.size() ? -1 : index + 1, at, size});
    at += size;
  }

  std::priority_queue<Bigram, std::vector<Bigram>, BigramOrder> queue;
  auto try_pair = [&](int32_t left, int32_t right) {
    if (left < 0 || right < 0) return;
    const uint32_t size = symbols[left].size + symbols[right].size;
    const int32_t id = lookup(std::string_view(text).substr(symbols[left].begin, size));
    if (id >= 0) queue.push({scores_[id], left, right, size});
  };
  for (int32_t i = 1; i < static_cast<int32_t>(symbols.size()); ++i) try_pair(i - 1, i);

  while (!queue.empty()) {
    const Bigram bigram = queue.top();
    queue.pop();
    Symbol& left = symbols[bigram.left];
    Symbol& right = symbols[bigram.right];
    // Stale: one side was merged away or grew since the pair was queued (sizes only grow).
    if (left.size == 0 || right.size == 0 || left.size + right.size != bigram.size) continue;
    left.size += right.size;
    right.size = 0;
    left.next = right.next;
    if (right.next >= 0) symbols[right.next].prev = bigram.left;
    try_pair(left.prev, bigram.left);
    try_pair(bigram.left, left.next);
  }

  for (int32_t i = symbols.empty() ? -1 : 0; i >= 0; i = symbols[i].next) {
    const std::string_view piece = std::string_view(text).substr(symbols[i].begin, symbols[i].size);
    if (const int32_t id = lookup(piece); id >= 0) {
      out.push_back(id);
      continue;
    }
    // Every merged symbol is a token, so this is one character the vocabulary lacks: spell it in bytes.
    for (char c : piece) {
      const uint8_t byte = static_cast<uint8_t>(c);
      int32_t id = byte_token(byte);
      if (id < 0) id = lookup(std::string_view(&c, 1));  // llama.cpp's fallback: the byte as a one-char token
      if (id < 0)
        throw Error(origin() + ": tokenizer.ggml.tokens: no byte token for byte " + std::to_string(byte) +
                    " (vocabulary lacks <0x..> tokens)");
      out.push_back(id);
    }
  }
}

}  // namespace sparrow::tokenizer_impl
