#pragma once
// The attention cells of the verification matrix: a backend's attention reading K and V blocks of every
// (K codec, V codec) pair the KV cache accepts, straight from the head-major layout of ops/backend.h, against
// float64 softmax attention over the REFERENCE-decoded keys and values.
//
// A pair has one cell per heads (n_heads/n_kv_heads) x KV length n_kv x mask (causal or sliding-window). In a
// cell the queries are the last min(n_kv, 4) positions, so causal masking is exercised; a windowed cell uses
// sliding_window = max(1, n_kv / 3) and stores its keys in a ring of window + n_tokens slots, as the KV cache
// stores sliding layers. A case is one output row (query token, head); it passes when every element is within
// kAttentionTolerance * max|v^| over the values that row sees. max_err is the largest such relative error.
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "formats/kv/kv_codec.h"
#include "verify/target.h"
#include "verify/verify.h"

namespace sparrow::verify {

struct HeadGroup {
  int n_heads = 1, n_kv_heads = 1;
};

// The cells of one pair, in report order: heads, then n_kv, then mask.
struct AttentionShapes {
  std::vector<HeadGroup> heads = {{1, 1}, {4, 2}, {8, 1}, {8, 2}};
  std::vector<int> n_kv = {1, 7, 64, 512, 4097};
  std::vector<Mask> masks = {Mask::Causal, Mask::Windowed};
  int cells_per_pair() const { return int(heads.size() * n_kv.size() * masks.size()); }
};

// In units of max|v^|. A float32 online softmax against float64 lands around 1e-6 (the CPU's worst cell:
// 1.6e-6); the codecs' float scores (checked to score_rel = 1e-4 of |q| |x|, in practice ~1e-6) move logits by
// a few 1e-5 at most, at d = 512 with the 4x "hot" queries. Broken kernels land at 3e-4 and above (an ignored
// window 8e-4, a scale of 1/sqrt(d - 1) 3e-4: docs/verify.md).
constexpr double kAttentionTolerance = 1e-4;

std::string_view mask_name(Mask mask);

// Every (K codec, V codec) pair from `codecs` (K: any codec; V: any codec that is not keys-only) x shapes, in
// codec order (K outer, V inner), each pair's cells in AttentionShapes order.
std::vector<AttentionCell> run_attention_cells(const Target& target,
                                               std::span<const formats::KvCodecInfo> codecs = formats::kv_codecs(),
                                               const AttentionShapes& shapes = {});

// One row per pair (cells passed per head dim and their max_err), a count line, then the first notes.
std::string format_attention_cells(const std::vector<AttentionCell>& cells);

}  // namespace sparrow::verify
