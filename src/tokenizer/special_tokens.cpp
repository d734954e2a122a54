#include "tokenizer/special_tokens.h"

#include <algorithm>

namespace sparrow::tokenizer_impl {

void SpecialTokenMatcher::build(const std::vector<Candidate>& candidates) {
  candidates_ = candidates;
  node_candidate_.assign(1, -1);  // node 0 is the root
  root_children_.assign(256, -1);
  children_.clear();
  any_always_split_ = false;
  for (size_t index = 0; index < candidates_.size(); ++index) {
    const Candidate& candidate = candidates_[index];
    if (candidate.text.empty()) continue;  // an empty text never occurs (llama.cpp renames empty tokens)
    any_always_split_ = any_always_split_ || !candidate.only_if_parse_special;
    int32_t node = 0;
    for (char c : candidate.text) {
      const uint8_t byte = static_cast<uint8_t>(c);
      int32_t next = child(node, byte);
      if (next < 0) {
        next = static_cast<int32_t>(node_candidate_.size());
        node_candidate_.push_back(-1);
        if (node == 0) {
          root_children_[byte] = next;
        } else {
          children_.emplace((static_cast<uint64_t>(node) << 8) | byte, next);
        }
      }
      node = next;
    }
    // Token texts are unique, so no two candidates end at one node.
    node_candidate_[node] = static_cast<int32_t>(index);
  }
}

int32_t SpecialTokenMatcher::child(int32_t node, uint8_t byte) const {
  if (node == 0) return root_children_.empty() ? -1 : root_children_[byte];
  auto it = children_.find((static_cast<uint64_t>(node) << 8) | byte);
  return it == children_.end() ? -1 : it->second;
}

// llama.cpp's rule on one cluster: candidates in priority order, each taking its leftmost occurrences that
// lie wholly inside the stretches no earlier candidate took.
void SpecialTokenMatcher::resolve(std::string_view text, Cluster& cluster, std::vector<Piece>& taken) const {
  std::sort(cluster.candidates.begin(), cluster.candidates.end());  // priority order
  struct Span {
    size_t begin, end;
  };
  std::vector<Span> free{{cluster.begin, cluster.end}}, still_free;
  const size_t first_taken = taken.size();
  for (uint32_t index : cluster.candidates) {
    const Candidate& candidate = candidates_[index];
    still_free.clear();
    for (const Span& span : free) {
      const std::string_view window = text.substr(0, span.end);
      size_t from = span.begin;
      for (size_t at; (at = window.find(candidate.text, from)) != std::string_view::npos;) {
        if (at > from) still_free.push_back({from, at});
        taken.push_back({at, at + candidate.text.size(), candidate.id});
        from = at + candidate.text.size();
      }
      if (from < span.end) still_free.push_back({from, span.end});
    }
    free.swap(still_free);
  }
  std::sort(taken.begin() + static_cast<std::ptrdiff_t>(first_taken), taken.end(),
            [](const Piece& a, const Piece& b) { return a.begin < b.begin; });
}

std::vector<SpecialTokenMatcher::Piece> SpecialTokenMatcher::split(std::string_view text, bool parse_special) const {
  std::vector<Piece> taken;
  if (parse_special || any_always_split_) {
    Cluster cluster;
    bool open = false;
    // listed_in[c] == cluster number when candidate c is already listed for that cluster: a long run of spaces
    // holds ~30 overlapping candidates at every byte, and each need be tried once.
    std::vector<uint32_t> listed_in;
    uint32_t cluster_number = 0;
    for (size_t start = 0; start < text.size(); ++start) {
      if (open && start >= cluster.end) {
        resolve(text, cluster, taken);
        open = false;
      }
      int32_t node = child(0, static_cast<uint8_t>(text[start]));
      for (size_t next = start + 1; node >= 0; ++next) {
        const int32_t index = node_candidate_[node];
        if (index >= 0 && (parse_special || !candidates_[index].only_if_parse_special)) {
          if (!open) {
            cluster.begin = cluster.end = start;
            cluster.candidates.clear();
            open = true;
            ++cluster_number;
            if (listed_in.empty()) listed_in.assign(candidates_.size(), 0);
          }
          cluster.end = std::max(cluster.end, next);
          if (listed_in[index] != cluster_number) {
            listed_in[index] = cluster_number;
            cluster.candidates.push_back(static_cast<uint32_t>(index));
          }
        }
        if (next == text.size()) break;
        node = child(node, static_cast<uint8_t>(text[next]));
      }
    }
    if (open) resolve(text, cluster, taken);
  }

  std::vector<Piece> pieces;
  size_t cursor = 0;
  for (const Piece& special : taken) {
    if (special.begin > cursor) pieces.push_back({cursor, special.begin, -1});
    pieces.push_back(special);
    cursor = special.end;
  }
  if (cursor < text.size()) pieces.push_back({cursor, text.size(), -1});
  return pieces;
}

}  // namespace sparrow::tokenizer_impl
