#pragma once
// Splitting a text around special tokens (control, user-defined, unknown) before the model's merges run, with
// the result of llama.cpp's tokenizer_st_partition: special tokens are tried one at a time in priority order
// (longest text first), each taking its leftmost non-overlapping occurrences in the text not yet taken.
//
// llama.cpp rescans the whole text once per special token (Gemma 3 has ~6400 of them). Here one pass over a
// byte trie finds where special tokens occur and groups overlapping occurrences into clusters; a cluster
// shares no byte with any other, so llama.cpp's rule can run on each cluster alone, trying only the tokens
// that occur in it. Same split, in time linear in the text (times the trie depth).
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace sparrow::tokenizer_impl {

class SpecialTokenMatcher {
 public:
  struct Candidate {
    std::string_view text;  // must outlive the matcher
    int32_t id;
    bool only_if_parse_special;  // control and unknown tokens; user-defined ones are always split out
  };
  // One piece of a split text: a special token, or a run of plain text [begin, end) when token < 0.
  struct Piece {
    size_t begin = 0, end = 0;
    int32_t token = -1;
  };

  // candidates: in priority order, first = tried first.
  void build(const std::vector<Candidate>& candidates);
  std::vector<Piece> split(std::string_view text, bool parse_special) const;

 private:
  // A stretch of text [begin, end) covered by overlapping occurrences of the special tokens listed.
  struct Cluster {
    size_t begin = 0, end = 0;
    std::vector<uint32_t> candidates;  // indices into candidates_, each once
  };
  int32_t child(int32_t node, uint8_t byte) const;
  // Appends the special tokens taken inside a cluster, in text order.
  void resolve(std::string_view text, Cluster& cluster, std::vector<Piece>& taken) const;

  std::vector<Candidate> candidates_;
  std::vector<int32_t> node_candidate_;             // per trie node: index into candidates_ ending here, or -1
  std::vector<int32_t> root_children_;              // 256 entries: the root's child per first byte, or -1
  std::unordered_map<uint64_t, int32_t> children_;  // (node << 8 | byte) -> child, below the root
  bool any_always_split_ = false;                   // some candidate is split out even without parse_special
};

}  // namespace sparrow::tokenizer_impl
