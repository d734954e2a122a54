// Gemma 4's BPE tokenizer, with the ids of llama.cpp's llm_tokenizer_bpe for pre-tokenizer "gemma4":
//   1. spaces are spelled "▁" and the text is re-encoded code point by code point (undecodable bytes -> U+FFFD);
//   2. it is split into runs of '\n' and runs of anything else ([^\n]+|[\n]+); a run of newlines that is a token
//      is emitted whole;
//   3. each run starts as one symbol per code point, and the adjacent pair with the lowest merge rank is merged
//      until no pair has one (ties: leftmost);
//   4. a symbol that is not a token becomes <0xXX> byte tokens (bytes without one are dropped, as llama.cpp).
#include <queue>
#include <string>
#include <vector>

#include "tokenizer/utf8.h"
#include "tokenizer/vocab_tokenizer.h"
#include "util/error.h"

namespace sparrow::tokenizer_impl {
namespace {

// A candidate merge of symbol `left` with its right neighbour, valid while both keep the sizes they had.
struct Bigram {
  int32_t rank;
  int32_t left, right;
  uint32_t left_size, right_size;
};

// Lowest rank first; among equal ranks the leftmost pair (llama.cpp's order, which decides the ids).
struct BigramOrder {
  bool operator()(const Bigram& a, const Bigram& b) const {
    return a.rank > b.rank || (a.rank == b.rank && a.left > b.left);
  }
};

}  // namespace

struct Gemma4BpeTokenizer::Symbol {
  int32_t prev, next;    // neighbours among live symbols of the run, -1 at the ends
  uint32_t begin, size;  // bytes of the run; size 0 once merged into the symbol on its left
  int32_t id;            // the token the symbol's text is, or -1
};

Gemma4BpeTokenizer::Gemma4BpeTokenizer(TokenizerVocab& vocab) : VocabTokenizer(vocab) {
  if (vocab.merges.empty()) throw Error(origin() + ": tokenizer.ggml.merges: missing or empty (BPE needs merges)");
  add_bos_default_ = true;  // llama.cpp forces add_bos for Gemma 4 whatever the file says
  merges_by_ids_.reserve(vocab.merges.size());
  ascii_merge_ranks_.assign(128 * 128, -1);
  for (size_t rank = 0; rank < vocab.merges.size(); ++rank) {
    const std::string& text = vocab.merges[rank];
    // llama.cpp splits at the first space after the first byte; symbols never hold a space (they are spelled
    // "▁"), so a merge with a space in either half, or without a separator, can never apply.
    const size_t space = text.find(' ', 1);
    if (space == std::string::npos) continue;
    const std::string_view left = std::string_view(text).substr(0, space);
    const std::string_view right = std::string_view(text).substr(space + 1);
    if (left.find(' ') != std::string_view::npos || right.find(' ') != std::string_view::npos || right.empty())
      continue;
    const int32_t left_id = lookup(left), right_id = lookup(right);
    const MergeTable::Merge merge{static_cast<int32_t>(rank)};
    // Every table keeps the first rank of a repeated merge, as llama.cpp's bpe_ranks.emplace.
    if (left.size() == 1 && right.size() == 1 && is_ascii(left) && is_ascii(right)) {
      int32_t& ascii_rank = ascii_merge_ranks_[static_cast<uint8_t>(left[0]) * 128 + static_cast<uint8_t>(right[0])];
      if (ascii_rank < 0) ascii_rank = merge.rank;
    }
    if (left_id >= 0 && right_id >= 0) {
      merges_by_ids_.insert(left_id, right_id, merge);
    } else {
      merges_by_text_.emplace(text, merge);
    }
  }
}

MergeTable::Merge Gemma4BpeTokenizer::find_merge(const Symbol& left, const Symbol& right, std::string_view word) const {
  if (left.size == 1 && right.size == 1) {
    const auto first = static_cast<uint8_t>(word[left.begin]), second = static_cast<uint8_t>(word[right.begin]);
    if (first < 128 && second < 128) return MergeTable::Merge{ascii_merge_ranks_[first * 128 + second]};
  }
  if (left.id >= 0 && right.id >= 0) return merges_by_ids_.find(left.id, right.id);
  if (merges_by_text_.empty()) return MergeTable::Merge{};
  std::string key(word.substr(left.begin, left.size));
  key += ' ';
  key += word.substr(right.begin, right.size);
  auto it = merges_by_text_.find(key);
  return it == merges_by_text_.end() ? MergeTable::Merge{} : it->second;
}

void Gemma4BpeTokenizer::encode_word(std::string_view word, std::vector<Symbol>& symbols,
                                     std::vector<int32_t>& out) const {
  symbols.clear();
  const int32_t whole = word.find_first_not_of('\n') == std::string_view::npos ? lookup(word) : -1;
  if (whole >= 0) {
    out.push_back(whole);  // a run of newlines the vocabulary has as one token (llama.cpp PR 21343)
    return;
  }
  for (uint32_t at = 0; at < word.size();) {
    const uint32_t size = static_cast<uint32_t>(std::min(utf8_sequence_length(word[at]), word.size() - at));
    const int32_t index = static_cast<int32_t>(symbols.size());
    symbols.push_back({index - 1, at + size == word.size() ? -1 : index + 1, at, size, lookup(word.substr(at, size))});
    at += size;
  }

  std::priority_queue<Bigram, std::vector<Bigram>, BigramOrder> queue;
  auto try_pair = [&](int32_t left, int32_t right) {
    if (left < 0 || right < 0) return;
    const MergeTable::Merge merge = find_merge(symbols[left], symbols[right], word);
    if (merge.rank >= 0) queue.push({merge.rank, left, right, symbols[left].size, symbols[right].size});
  };
  for (int32_t i = 1; i < static_cast<int32_t>(symbols.size()); ++i) try_pair(i - 1, i);

  while (!queue.empty()) {
    const Bigram bigram = queue.top();
    queue.pop();
    Symbol& left = symbols[bigram.left];
    Symbol& right = symbols[bigram.right];
    // Stale: one side was merged away or grew since the pair was queued (sizes only grow).
    if (left.size != bigram.left_size || right.size != bigram.right_size || right.size == 0) continue;
    left.size += right.size;
    right.size = 0;
    left.next = right.next;
    left.id = lookup(word.substr(left.begin, left.size));
    if (right.next >= 0) symbols[right.next].prev = bigram.left;
    try_pair(left.prev, bigram.left);
    try_pair(bigram.left, left.next);
  }

  for (int32_t i = symbols.empty() ? -1 : 0; i >= 0; i = symbols[i].next) {
    if (symbols[i].id >= 0) {
      out.push_back(symbols[i].id);
      continue;
    }
    for (char c : word.substr(symbols[i].begin, symbols[i].size)) {
      if (const int32_t id = byte_token(static_cast<uint8_t>(c)); id >= 0) out.push_back(id);
    }
  }
}

void Gemma4BpeTokenizer::encode_plain(std::string_view raw, bool /*after_special*/, std::vector<int32_t>& out) const {
  std::string spaced;
  spaced.reserve(raw.size() + raw.size() / 4);
  append_with_space_markers(raw, spaced);
  std::string text;
  text.reserve(spaced.size());
  for (size_t at = 0; at < spaced.size();) append_code_point(decode_code_point(spaced, at), text);
  if (text.size() > static_cast<size_t>(INT32_MAX))
    throw Error(origin() + ": text run of " + std::to_string(text.size()) + " bytes is too long to tokenize");

  std::vector<Symbol> symbols;
  for (size_t begin = 0; begin < text.size();) {
    const bool newlines = text[begin] == '\n';
    size_t end = begin;
    while (end < text.size() && (text[end] == '\n') == newlines) ++end;
    encode_word(std::string_view(text).substr(begin, end - begin), symbols, out);
    begin = end;
  }
}

}  // namespace sparrow::tokenizer_impl
