#pragma once
// Open-addressing hash tables for the tokenizers' hot lookups (private to src/tokenizer/). Encoding a few MB of
// text makes ~10^7 probes; std::unordered_map's node per entry costs a cache miss or two each, a flat table of
// small slots about one.
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

namespace sparrow::tokenizer_impl {

// splitmix64's finalizer: spreads every input bit over the whole word.
inline uint64_t mix64(uint64_t x) {
  x ^= x >> 30;
  x *= 0xBF58476D1CE4E5B9ull;
  x ^= x >> 27;
  x *= 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

inline uint64_t hash_text(std::string_view text) {
  uint64_t h = 0x9E3779B97F4A7C15ull ^ text.size();
  size_t at = 0;
  for (; at + 8 <= text.size(); at += 8) {
    uint64_t chunk;
    std::memcpy(&chunk, text.data() + at, 8);
    h = mix64(h ^ chunk);
  }
  uint64_t tail = 0;
  if (at < text.size()) std::memcpy(&tail, text.data() + at, text.size() - at);
  return mix64(h ^ tail);
}

// Smallest power of two >= 2 * n (load factor at most 1/2), at least 16.
inline size_t table_size_for(size_t n) {
  size_t size = 16;
  while (size < 2 * n) size *= 2;
  return size;
}

// Token text -> id, over strings the caller keeps alive and unchanged.
class TokenIndex {
 public:
  // Returns the id of a text already present (a repeated token), or -1 when all texts are distinct.
  int32_t build(const std::vector<std::string>& texts) {
    texts_ = &texts;
    slots_.assign(table_size_for(texts.size()), Slot{0, -1});
    mask_ = slots_.size() - 1;
    for (size_t id = 0; id < texts.size(); ++id) {
      const uint64_t h = hash_text(texts[id]);
      size_t at = h & mask_;
      for (; slots_[at].id >= 0; at = (at + 1) & mask_) {
        if (slots_[at].tag == tag_of(h) && texts[slots_[at].id] == texts[id]) return slots_[at].id;
      }
      slots_[at] = Slot{tag_of(h), static_cast<int32_t>(id)};
    }
    return -1;
  }

  int32_t find(std::string_view text) const {
    const uint64_t h = hash_text(text);
    for (size_t at = h & mask_;; at = (at + 1) & mask_) {
      const Slot& slot = slots_[at];
      if (slot.id < 0) return -1;
      if (slot.tag == tag_of(h) && (*texts_)[slot.id] == text) return slot.id;
    }
  }

 private:
  struct Slot {
    uint32_t tag;  // high half of the hash: most mismatches are rejected without touching the text
    int32_t id;    // -1: empty
  };
  static uint32_t tag_of(uint64_t h) { return static_cast<uint32_t>(h >> 32); }
  const std::vector<std::string>* texts_ = nullptr;
  std::vector<Slot> slots_{Slot{0, -1}};
  size_t mask_ = 0;
};

// (left id, right id) -> a merge's rank.
class MergeTable {
 public:
  struct Merge {
    int32_t rank = -1;  // -1: no such merge
  };

  void reserve(size_t n) {
    slots_.assign(table_size_for(n), Slot{kEmpty, {}});
    mask_ = slots_.size() - 1;
  }

  // Keeps the first merge of a repeated pair (lowest rank), as llama.cpp's std::map::emplace does.
  void insert(int32_t left, int32_t right, Merge merge) {
    const uint64_t key = key_of(left, right);
    size_t at = mix64(key) & mask_;
    for (; slots_[at].key != kEmpty; at = (at + 1) & mask_) {
      if (slots_[at].key == key) return;
    }
    slots_[at] = Slot{key, merge};
  }

  Merge find(int32_t left, int32_t right) const {
    const uint64_t key = key_of(left, right);
    for (size_t at = mix64(key) & mask_;; at = (at + 1) & mask_) {
      if (slots_[at].key == key) return slots_[at].merge;
      if (slots_[at].key == kEmpty) return Merge{};
    }
  }

 private:
  static constexpr uint64_t kEmpty = ~0ull;  // no pair of non-negative int32 ids has this key
  static uint64_t key_of(int32_t left, int32_t right) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(left)) << 32) | static_cast<uint32_t>(right);
  }
  struct Slot {
    uint64_t key;
    Merge merge;
  };
  std::vector<Slot> slots_{Slot{kEmpty, {}}};
  size_t mask_ = 0;
};

}  // namespace sparrow::tokenizer_impl
