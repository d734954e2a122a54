#pragma once
// A sequence's state in a file: its KV cache and token count (and optionally the token ids that made it), so
// that a later session of the same model continues it without decoding those tokens again (a cached system
// prompt, a conversation put aside). Format: docs/state-files.md.
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "kv/kv_cache.h"
#include "runtime/model.h"

namespace sparrow {

// Writes the state of a sequence of n_past tokens held in `cache`; tokens is empty or the n_past ids. The file
// appears whole or not at all (written beside it, then renamed). Throws sparrow::Error naming the path.
void save_sequence_state(const std::string& path, const Model& model, const KvCache& cache, int32_t n_past,
                         std::span<const int32_t> tokens);

struct RestoredSequence {
  int32_t n_past = 0;
  std::vector<int32_t> tokens;  // as saved: empty or n_past ids
};
// Reads a state saved from the same model file and key transforms (Model::state_fingerprint) with the same KV codecs into `cache`, whose
// context must hold its tokens. Throws sparrow::Error naming the path and what does not match.
RestoredSequence restore_sequence_state(const std::string& path, const Model& model, KvCache& cache);

}  // namespace sparrow
