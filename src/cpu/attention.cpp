// Fused attention over the compressed KV cache on the CPU (flash attention: online softmax, no score matrix, no
// decoded copy of the cache). Every codec's score and accumulate are linear in one basis row per block
// (formats/kv/kv_codec.h), so a task expands a block of kKeyBlock keys into K rows once, scores every query row
// that sees them against those rows, then expands the values once and folds them into each row's accumulator,
// all in the codecs' own bases: queries are prepared (rotated, sketched) once per call and each output row
// leaves the V basis once, at the end. The codec enters as the batched expand function of its K and V
// (cpu/kv/cpu_kv_codecs.h), inside which the codec is a compile-time parameter.
//
// Work is split into (KV head, tile of query tokens, key range) tasks. Prefill has many tiles and each task
// covers its tiles' whole key range; decode (one token) has one tile per KV head, so its key range is split
// across the threads and the partial softmax states are merged at the end.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "cpu/attention.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep

#include <hwy/contrib/math/math-inl.h>
#include <hwy/highway.h>

HWY_BEFORE_NAMESPACE();
namespace sparrow::cpu::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// Query rows are processed four at a time (kRowTile): each expanded key or value row loaded from cache feeds four
// FMAs, which keeps the loops FMA-bound rather than load-bound. Vectors hold at most 16 floats and every basis row
// length is a multiple of 32 (head dims 64..512), so the loops below run whole vectors.
using DF = hn::CappedTag<float, 16>;

// scores[r * stride + j] = <q[r], rows[j]> for r < 4, j < n; rows `len` floats apart.
void ScoreTile(const float* const* q, const float* rows, int32_t n, int32_t len, float* scores, int32_t stride) {
  const DF d;
  const int32_t N = int32_t(hn::Lanes(d));
  for (int32_t j = 0; j < n; j += 2) {
    const float* x0 = rows + int64_t(j) * len;
    const float* x1 = j + 1 < n ? x0 + len : x0;  // an odd last key is computed twice, stored once
    auto a00 = hn::Zero(d), a01 = hn::Zero(d), a10 = hn::Zero(d), a11 = hn::Zero(d);
    auto a20 = hn::Zero(d), a21 = hn::Zero(d), a30 = hn::Zero(d), a31 = hn::Zero(d);
    for (int32_t i = 0; i < len; i += N) {
      const auto k0 = hn::LoadU(d, x0 + i), k1 = hn::LoadU(d, x1 + i);
      const auto q0 = hn::LoadU(d, q[0] + i), q1 = hn::LoadU(d, q[1] + i);
      a00 = hn::MulAdd(q0, k0, a00);
      a01 = hn::MulAdd(q0, k1, a01);
      a10 = hn::MulAdd(q1, k0, a10);
      a11 = hn::MulAdd(q1, k1, a11);
      const auto q2 = hn::LoadU(d, q[2] + i), q3 = hn::LoadU(d, q[3] + i);
      a20 = hn::MulAdd(q2, k0, a20);
      a21 = hn::MulAdd(q2, k1, a21);
      a30 = hn::MulAdd(q3, k0, a30);
      a31 = hn::MulAdd(q3, k1, a31);
    }
    scores[j] = hn::GetLane(hn::SumOfLanes(d, a00));
    scores[stride + j] = hn::GetLane(hn::SumOfLanes(d, a10));
    scores[2 * stride + j] = hn::GetLane(hn::SumOfLanes(d, a20));
    scores[3 * stride + j] = hn::GetLane(hn::SumOfLanes(d, a30));
    if (j + 1 < n) {
      scores[j + 1] = hn::GetLane(hn::SumOfLanes(d, a01));
      scores[stride + j + 1] = hn::GetLane(hn::SumOfLanes(d, a11));
      scores[2 * stride + j + 1] = hn::GetLane(hn::SumOfLanes(d, a21));
      scores[3 * stride + j + 1] = hn::GetLane(hn::SumOfLanes(d, a31));
    }
  }
}

// p[j] = exp(p[j] - max) in place for j < n; returns the sum.
float ExpShifted(float* p, int32_t n, float max) {
  const DF d;
  const int32_t N = int32_t(hn::Lanes(d));
  const auto vmax = hn::Set(d, max);
  auto sum = hn::Zero(d);
  int32_t j = 0;
  for (; j + N <= n; j += N) {
    const auto e = hn::Exp(d, hn::Sub(hn::LoadU(d, p + j), vmax));
    hn::StoreU(e, d, p + j);
    sum = hn::Add(sum, e);
  }
  float total = hn::GetLane(hn::SumOfLanes(d, sum));
  for (; j < n; ++j) total += (p[j] = std::exp(p[j] - max));
  return total;
}

// acc[r] = acc[r] * correction[r] + sum_j w[r * stride + j] * rows[j] for r < 4; rows `len` floats apart. Each
// pass keeps two vectors of all four accumulators in registers across all n rows.
void AccumulateTile(float* const* acc, const float* correction, const float* w, int32_t stride, const float* rows,
                    int32_t n, int32_t len) {
  const DF d;
  const int32_t N = int32_t(hn::Lanes(d));
  const auto c0 = hn::Set(d, correction[0]), c1 = hn::Set(d, correction[1]);
  const auto c2 = hn::Set(d, correction[2]), c3 = hn::Set(d, correction[3]);
  for (int32_t i = 0; i < len; i += 2 * N) {
    auto a00 = hn::Mul(c0, hn::LoadU(d, acc[0] + i)), a01 = hn::Mul(c0, hn::LoadU(d, acc[0] + i + N));
    auto a10 = hn::Mul(c1, hn::LoadU(d, acc[1] + i)), a11 = hn::Mul(c1, hn::LoadU(d, acc[1] + i + N));
    auto a20 = hn::Mul(c2, hn::LoadU(d, acc[2] + i)), a21 = hn::Mul(c2, hn::LoadU(d, acc[2] + i + N));
    auto a30 = hn::Mul(c3, hn::LoadU(d, acc[3] + i)), a31 = hn::Mul(c3, hn::LoadU(d, acc[3] + i + N));
    for (int32_t j = 0; j < n; ++j) {
      const float* x = rows + int64_t(j) * len + i;
      const auto v0 = hn::LoadU(d, x), v1 = hn::LoadU(d, x + N);
      const auto w0 = hn::Set(d, w[j]), w1 = hn::Set(d, w[stride + j]);
      a00 = hn::MulAdd(w0, v0, a00);
      a01 = hn::MulAdd(w0, v1, a01);
      a10 = hn::MulAdd(w1, v0, a10);
      a11 = hn::MulAdd(w1, v1, a11);
      const auto w2 = hn::Set(d, w[2 * stride + j]), w3 = hn::Set(d, w[3 * stride + j]);
      a20 = hn::MulAdd(w2, v0, a20);
      a21 = hn::MulAdd(w2, v1, a21);
      a30 = hn::MulAdd(w3, v0, a30);
      a31 = hn::MulAdd(w3, v1, a31);
    }
    hn::StoreU(a00, d, acc[0] + i);
    hn::StoreU(a01, d, acc[0] + i + N);
    hn::StoreU(a10, d, acc[1] + i);
    hn::StoreU(a11, d, acc[1] + i + N);
    hn::StoreU(a20, d, acc[2] + i);
    hn::StoreU(a21, d, acc[2] + i + N);
    hn::StoreU(a30, d, acc[3] + i);
    hn::StoreU(a31, d, acc[3] + i + N);
  }
}

}  // namespace sparrow::cpu::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "cpu/attention.h"
#include "cpu/kv/cpu_kv_codecs.h"
#include "util/error.h"

namespace sparrow::cpu {

HWY_EXPORT(ScoreTile);
HWY_EXPORT(ExpShifted);
HWY_EXPORT(AccumulateTile);

namespace {

using formats::KvCodec;
using formats::kv_codec_info;

constexpr int32_t kKeyBlock = 32;          // keys expanded at once: their K and V rows stay in L1/L2
constexpr int64_t kRowTile = 4;            // query rows the score and accumulate kernels take at once
constexpr int64_t kTileTokens = 16;        // query tokens per prefill task
constexpr int64_t kMinKeysPerSplit = 256;  // below this, splitting a key range costs more than it saves

// What one call needs, derived once from its arguments.
struct Plan {
  const AttentionArgs& a;
  int32_t d, group;
  int32_t k_floats, v_floats;  // basis floats of a K row (= prepared query) and of a V row (= accumulator)
  size_t k_block_bytes, v_block_bytes;
  ExpandBlocks expand_k, expand_v;
  const formats::KvCodecOps& v_ops;
  int64_t tile, n_tiles, n_splits;

  explicit Plan(const AttentionArgs& args, int n_threads)
      : a(args),
        d(args.kv.head_dim),
        group(args.n_heads / args.kv.n_kv_heads),
        k_floats(int32_t(kv_codec_info(args.kv.k_codec).query_floats(d))),
        v_floats(int32_t(kv_codec_info(args.kv.v_codec).accumulator_floats(d))),
        k_block_bytes(kv_codec_info(args.kv.k_codec).block_bytes(d)),
        v_block_bytes(kv_codec_info(args.kv.v_codec).block_bytes(d)),
        expand_k(kv_expand_blocks(args.kv.k_codec)),
        expand_v(kv_expand_blocks(args.kv.v_codec)),
        v_ops(kv_codec_ops(args.kv.v_codec)) {
    // Small tiles when there are few tokens, so that short prompts still spread over the threads.
    tile = std::clamp<int64_t>(a.n_tokens / (2 * n_threads), 1, kTileTokens);
    n_tiles = (a.n_tokens + tile - 1) / tile;
    // Too few (tile, KV head) tasks to keep the threads busy (decode): split the key range as well.
    const int64_t base_tasks = n_tiles * a.kv.n_kv_heads;
    const int64_t longest_range = std::min<int64_t>(a.first_position + a.n_tokens,
                                                    a.sliding_window > 0 ? a.sliding_window + tile : INT64_MAX);
    n_splits = std::clamp<int64_t>((2 * n_threads + base_tasks - 1) / base_tasks, 1,
                                   std::max<int64_t>(1, longest_range / kMinKeysPerSplit));
  }
  int64_t n_tasks() const { return n_tiles * a.kv.n_kv_heads * n_splits; }
  int64_t rows_per_tile() const { return tile * group; }
  // Rows rounded up to whole row tiles: the padding rows have zero weights and a scratch accumulator.
  int64_t padded_rows() const { return (rows_per_tile() + kRowTile - 1) / kRowTile * kRowTile; }
  int64_t position(int64_t t) const { return a.first_position + t; }
  int64_t first_key(int64_t t) const {
    return a.sliding_window > 0 ? std::max<int64_t>(0, position(t) - a.sliding_window + 1) : 0;
  }
  // The keys token t reads from the main blocks: [main_begin, main_end), less the protected positions.
  int64_t main_begin(int64_t t) const { return std::max<int64_t>(first_key(t), a.kv.protects() ? a.kv.sinks : 0); }
  int64_t main_end(int64_t t) const {
    return std::max(main_begin(t), position(t) + 1 - (a.kv.protects() ? a.kv.window : 0));
  }
  const uint8_t* k_blocks(int32_t kv_head, int64_t p) const {
    return static_cast<const uint8_t*>(a.kv.k) + (kv_head * a.kv.capacity + p % a.kv.capacity) * k_block_bytes;
  }
  const uint8_t* v_blocks(int32_t kv_head, int64_t p) const {
    return static_cast<const uint8_t*>(a.kv.v) + (kv_head * a.kv.capacity + p % a.kv.capacity) * v_block_bytes;
  }
};

// One query row's online-softmax state over the keys seen so far; its accumulator lives beside it.
struct RowState {
  float max = -std::numeric_limits<float>::infinity();
  float sum = 0;
};

// A task: tile `tile_index` of query tokens, KV head `kv_head`, keys [key_begin, key_end).
struct Task {
  int32_t kv_head;
  int64_t t0, t1;
  int64_t key_begin, key_end;
};

Task task_of(const Plan& plan, int64_t index) {
  const int64_t split = index % plan.n_splits, rest = index / plan.n_splits;
  Task task;
  task.kv_head = int32_t(rest % plan.a.kv.n_kv_heads);
  task.t0 = (rest / plan.a.kv.n_kv_heads) * plan.tile;
  task.t1 = std::min(plan.a.n_tokens, task.t0 + plan.tile);
  const int64_t lo = plan.main_begin(task.t0), hi = plan.main_end(task.t1 - 1);
  // Splits start on key-block boundaries so every split but the last expands whole blocks.
  const int64_t per_split = (hi - lo + plan.n_splits - 1) / plan.n_splits;
  const int64_t chunk = (per_split + kKeyBlock - 1) / kKeyBlock * kKeyBlock;
  task.key_begin = std::min(hi, lo + split * chunk);
  task.key_end = std::min(hi, task.key_begin + chunk);
  return task;
}

struct Scratch {
  std::vector<float> k_rows, v_rows, weights, corrections, spare_acc;
  std::vector<int64_t> lo, hi;  // each row's visible keys in the current block, [lo, hi)
};

// Scores row tile g (rows g..g+3, those past n_rows padded) against the expanded keys and updates each visible
// row's online softmax; leaves in s.weights the block's softmax weights (0 where masked) and in s.corrections the
// factor that rescales each row's accumulator.
void score_row_tile(const Plan& plan, const Task& task, int64_t g, int64_t n_rows, int64_t p0, int32_t nb,
                    const float* prepared, RowState* states, Scratch& s) {
  const AttentionArgs& a = plan.a;
  int64_t lo = INT64_MAX, hi = INT64_MIN;
  const float* q[kRowTile];
  for (int64_t r = g; r < g + kRowTile; ++r) {
    const int64_t real = std::min(r, n_rows - 1);
    const int64_t head = (task.t0 + real / plan.group) * a.n_heads + task.kv_head * plan.group + real % plan.group;
    q[r - g] = prepared + head * plan.k_floats;
    std::fill_n(s.weights.data() + r * kKeyBlock, kKeyBlock, 0.0f);
    s.corrections[r] = 1.0f;
    if (r < n_rows && s.lo[r] < s.hi[r]) {
      lo = std::min(lo, s.lo[r]);
      hi = std::max(hi, s.hi[r]);
    }
  }
  if (lo >= hi) return;
  const int32_t off = int32_t(lo - p0);
  float* w = s.weights.data() + g * kKeyBlock;
  HWY_DYNAMIC_DISPATCH(ScoreTile)(q, s.k_rows.data() + int64_t(off) * plan.k_floats, int32_t(hi - lo), plan.k_floats,
                                  w + off, kKeyBlock);
  for (int64_t r = g; r < std::min(g + kRowTile, n_rows); ++r) {
    float* wr = s.weights.data() + r * kKeyBlock;
    const int32_t row_lo = int32_t(s.lo[r] - p0), row_hi = int32_t(s.hi[r] - p0);
    if (row_lo >= row_hi) {
      std::fill_n(wr, kKeyBlock, 0.0f);
      continue;
    }
    RowState& st = states[r];
    const float new_max = std::max(st.max, *std::max_element(wr + row_lo, wr + row_hi));
    s.corrections[r] = std::exp(st.max - new_max);  // 0 for the first block (max was -inf)
    st.sum = st.sum * s.corrections[r] + HWY_DYNAMIC_DISPATCH(ExpShifted)(wr + row_lo, row_hi - row_lo, new_max);
    st.max = new_max;
    std::fill(wr, wr + row_lo, 0.0f);
    std::fill(wr + row_hi, wr + nb, 0.0f);
  }
}

// Folds keys [task.key_begin, task.key_end) into the rows' states and accumulators (row r = token
// t0 + r / group, query head kv_head * group + r % group).
void attend(const Plan& plan, const Task& task, const float* prepared, RowState* states, float* acc,
            Scratch& s) {
  const AttentionArgs& a = plan.a;
  const int64_t n_rows = (task.t1 - task.t0) * plan.group;
  for (int64_t p0 = task.key_begin; p0 < task.key_end;) {
    // A block of keys stays inside one lap of the ring, so its blocks are consecutive in memory.
    const int64_t p1 = std::min({task.key_end, p0 + kKeyBlock, (p0 / a.kv.capacity + 1) * a.kv.capacity});
    const int32_t nb = int32_t(p1 - p0);
    bool any = false;
    for (int64_t r = 0; r < n_rows; ++r) {
      const int64_t t = task.t0 + r / plan.group;
      s.lo[r] = std::max(p0, plan.main_begin(t));
      s.hi[r] = std::min(p1, plan.main_end(t));
      any = any || s.lo[r] < s.hi[r];
    }
    if (any) {
      plan.expand_k(plan.k_blocks(task.kv_head, p0), nb, plan.d, s.k_rows.data());
      for (int64_t g = 0; g < n_rows; g += kRowTile) score_row_tile(plan, task, g, n_rows, p0, nb, prepared, states, s);
      plan.expand_v(plan.v_blocks(task.kv_head, p0), nb, plan.d, s.v_rows.data());
      for (int64_t g = 0; g < n_rows; g += kRowTile) {
        float* tile_acc[kRowTile];
        for (int64_t r = g; r < g + kRowTile; ++r)
          tile_acc[r - g] = r < n_rows ? acc + r * plan.v_floats : s.spare_acc.data();
        HWY_DYNAMIC_DISPATCH(AccumulateTile)(tile_acc, s.corrections.data() + g, s.weights.data() + g * kKeyBlock,
                                             kKeyBlock, s.v_rows.data(), nb, plan.v_floats);
      }
    }
    p0 = p1;
  }
}

// The protected positions' part of query row (t, h) (KvLayerView::protects): its softmax state and its
// unnormalized output, out of the protected codec's basis. At most sinks + window keys, read one by one: key j is
// sink lo + j, then window position window_begin + (j - n_sinks).
RowState attend_protected(const Plan& plan, int64_t t, int32_t h, float* out) {
  const KvLayerView& kv = plan.a.kv;
  const formats::KvCodecInfo& info = kv_codec_info(kv.protected_codec);
  const formats::KvCodecOps& ops = kv_codec_ops(kv.protected_codec);
  const int32_t d = plan.d;
  const size_t bytes = info.block_bytes(d);
  const int64_t head_base = int64_t(h / plan.group) * kv.protected_slots();
  const int64_t pos = plan.position(t), lo = plan.first_key(t);
  const int64_t n_sinks = std::max<int64_t>(0, std::min<int64_t>(kv.sinks, pos + 1) - lo);
  const int64_t window_begin = std::max<int64_t>({lo, kv.sinks, pos - kv.window + 1});
  const int64_t n_keys = n_sinks + std::max<int64_t>(0, pos + 1 - window_begin);
  const auto slot_of = [&](int64_t j) { return j < n_sinks ? lo + j : kv.window_slot(window_begin + j - n_sinks); };
  RowState st;
  std::fill_n(out, d, 0.0f);
  if (n_keys == 0) return st;
  // Rows of a thread reuse its buffers: this runs once per output row.
  thread_local std::vector<float> prepared, scores, acc;
  prepared.resize(info.query_floats(d));
  scores.resize(size_t(n_keys));
  acc.assign(info.accumulator_floats(d), 0.0f);
  ops.prepare_query(plan.a.q + (t * plan.a.n_heads + h) * int64_t(d), d, prepared.data());
  for (float& x : prepared) x *= plan.a.scale;
  const auto* k = static_cast<const uint8_t*>(kv.protected_k);
  const auto* v = static_cast<const uint8_t*>(kv.protected_v);
  for (int64_t j = 0; j < n_keys; ++j) {
    scores[j] = ops.score(prepared.data(), k + (head_base + slot_of(j)) * bytes, d);
    st.max = std::max(st.max, scores[j]);
  }
  for (int64_t j = 0; j < n_keys; ++j) {
    const float w = std::exp(scores[j] - st.max);
    st.sum += w;
    ops.accumulate(w, v + (head_base + slot_of(j)) * bytes, d, acc.data());
  }
  ops.finish(acc.data(), d, out);
  return st;
}

// out = finish(acc / sum): the row leaves the V codec's basis once. With protected positions, the main and the
// protected parts leave their bases unnormalized (finish is linear) and add at their common maximum.
void finish_row(const Plan& plan, const RowState& st, float* acc, int64_t t, int32_t h) {
  float* out = plan.a.out + (t * plan.a.n_heads + h) * int64_t(plan.d);
  if (!plan.a.kv.protects()) {
    const float inv = st.sum > 0 ? 1.0f / st.sum : 0.0f;
    for (int32_t i = 0; i < plan.v_floats; ++i) acc[i] *= inv;
    plan.v_ops.finish(acc, plan.d, out);
    return;
  }
  float protected_out[formats::kMaxKvHeadDim];
  const RowState prot = attend_protected(plan, t, h, protected_out);
  const float max = std::max(st.max, prot.max);
  const float main_scale = st.sum > 0 ? std::exp(st.max - max) : 0.0f;
  const float protected_scale = prot.sum > 0 ? std::exp(prot.max - max) : 0.0f;
  const float sum = st.sum * main_scale + prot.sum * protected_scale;
  const float inv = sum > 0 ? 1.0f / sum : 0.0f;
  plan.v_ops.finish(acc, plan.d, out);
  for (int32_t i = 0; i < plan.d; ++i) out[i] = (out[i] * main_scale + protected_out[i] * protected_scale) * inv;
}

int32_t head_of(const Plan& plan, const Task& task, int64_t r) {
  return task.kv_head * plan.group + int32_t(r % plan.group);
}

void check(const AttentionArgs& a) {
  if (a.kv.n_kv_heads <= 0 || a.n_heads % a.kv.n_kv_heads != 0)
    throw Error("attention: n_heads (" + std::to_string(a.n_heads) + ") must be a multiple of n_kv_heads (" +
                std::to_string(a.kv.n_kv_heads) + ")");
  if (!formats::kv_head_dim_supported(a.kv.head_dim))
    throw Error("attention: head dim " + std::to_string(a.kv.head_dim) + " is not supported (64, 128, 256 or 512)");
  if (kv_codec_info(a.kv.v_codec).keys_only)
    throw Error(std::string("attention: ") + std::string(kv_codec_info(a.kv.v_codec).name) +
                " stores keys only and cannot hold V");
  if (a.kv.protects() && (kv_codec_info(a.kv.protected_codec).keys_only || a.kv.window_capacity < a.kv.window ||
                          a.kv.window_capacity < 1 || a.kv.sinks < 0))
    throw Error("attention: protected positions need a codec that holds V and a window ring of at least the window");
}

// kv_store's protected blocks (KvLayerView::protects): sinks in their own slots, every position of the batch
// in the window ring (which holds a whole batch), keys centered like the main blocks'.
void store_protected(ThreadPool& pool, const KvLayerView& kv, const float* k, const float* v, int64_t n_tokens,
                     int32_t first_position) {
  const formats::KvCodecOps& ops = kv_codec_ops(kv.protected_codec);
  const int32_t d = kv.head_dim;
  const size_t bytes = kv_codec_info(kv.protected_codec).block_bytes(d);
  pool.parallel_for(n_tokens * kv.n_kv_heads, [&](int64_t row, int) {
    const int64_t p = first_position + row / kv.n_kv_heads;
    const int32_t h = int32_t(row % kv.n_kv_heads);
    float key[formats::kMaxKvHeadDim];
    for (int32_t i = 0; i < d; ++i) key[i] = k[row * d + i] - (kv.k_center ? kv.k_center[int64_t(h) * d + i] : 0.0f);
    const auto put = [&](int64_t slot) {
      const int64_t block = int64_t(h) * kv.protected_slots() + slot;
      ops.encode(key, d, static_cast<uint8_t*>(kv.protected_k) + block * bytes);
      ops.encode(v + row * d, d, static_cast<uint8_t*>(kv.protected_v) + block * bytes);
    };
    if (p < kv.sinks) put(p);
    if (row / kv.n_kv_heads >= n_tokens - kv.window_capacity) put(kv.window_slot(p));  // no slot written twice
  });
}

}  // namespace

void kv_store(ThreadPool& pool, const KvLayerView& kv, const float* k, const float* v, int64_t n_tokens,
              int32_t first_position) {
  const formats::KvCodecOps& k_ops = kv_codec_ops(kv.k_codec);
  const formats::KvCodecOps& v_ops = kv_codec_ops(kv.v_codec);
  const int32_t d = kv.head_dim;
  const size_t k_bytes = kv_codec_info(kv.k_codec).block_bytes(d), v_bytes = kv_codec_info(kv.v_codec).block_bytes(d);
  // A batch longer than a ring keeps only its last `capacity` tokens; storing the others too would have two
  // threads write the same slot, and either could finish last.
  const int64_t first_kept = std::max<int64_t>(0, n_tokens - kv.capacity);
  pool.parallel_for((n_tokens - first_kept) * kv.n_kv_heads, [&](int64_t kept_row, int) {
    const int64_t row = first_kept * kv.n_kv_heads + kept_row;
    const int64_t t = row / kv.n_kv_heads;
    const int32_t h = int32_t(row % kv.n_kv_heads);
    const int64_t block = h * kv.capacity + (first_position + t) % kv.capacity;
    const float* key = k + row * d;
    float centered[formats::kMaxKvHeadDim];
    if (kv.k_center) {
      const float* center = kv.k_center + int64_t(h) * d;
      for (int32_t i = 0; i < d; ++i) centered[i] = key[i] - center[i];
      key = centered;
    }
    k_ops.encode(key, d, static_cast<uint8_t*>(kv.k) + block * k_bytes);
    v_ops.encode(v + row * d, d, static_cast<uint8_t*>(kv.v) + block * v_bytes);
  });
  if (kv.protects()) store_protected(pool, kv, k, v, n_tokens, first_position);
}

void attention(ThreadPool& pool, const AttentionArgs& a) {
  check(a);
  const Plan plan(a, pool.size());
  // Queries enter the K codec's basis once, with the softmax scale folded in.
  const formats::KvCodecOps& k_ops = kv_codec_ops(a.kv.k_codec);
  const int64_t n_queries = a.n_tokens * a.n_heads;
  std::vector<float> prepared(size_t(n_queries) * plan.k_floats);
  pool.parallel_for(n_queries, [&](int64_t row, int) {
    float* q = prepared.data() + row * plan.k_floats;
    k_ops.prepare_query(a.q + row * plan.d, plan.d, q);
    for (int32_t i = 0; i < plan.k_floats; ++i) q[i] *= a.scale;
  });

  const int64_t rows = plan.rows_per_tile();
  std::vector<Scratch> scratch(pool.size());
  for (Scratch& s : scratch) {
    s.k_rows.resize(size_t(kKeyBlock) * plan.k_floats);
    s.v_rows.resize(size_t(kKeyBlock) * plan.v_floats);
    s.weights.resize(size_t(plan.padded_rows()) * kKeyBlock);
    s.corrections.resize(plan.padded_rows());
    s.spare_acc.resize(plan.v_floats);
    s.lo.resize(rows);
    s.hi.resize(rows);
  }
  // Every task's states and accumulators, kept until the splits of a tile are merged.
  const int64_t n_tasks = plan.n_tasks();
  std::vector<RowState> states(size_t(n_tasks * rows));
  std::vector<float> acc(size_t(n_tasks * rows) * plan.v_floats, 0.0f);
  pool.parallel_for(n_tasks, [&](int64_t index, int thread) {
    const Task task = task_of(plan, index);
    RowState* st = states.data() + index * rows;
    float* ac = acc.data() + index * rows * plan.v_floats;
    attend(plan, task, prepared.data(), st, ac, scratch[thread]);
    if (plan.n_splits == 1)
      for (int64_t r = 0; r < (task.t1 - task.t0) * plan.group; ++r)
        finish_row(plan, st[r], ac + r * plan.v_floats, task.t0 + r / plan.group, head_of(plan, task, r));
  });
  if (plan.n_splits == 1) return;

  // Merge the splits of each (tile, KV head): rescale every partial to the common maximum.
  pool.parallel_for(n_tasks / plan.n_splits, [&](int64_t group_index, int) {
    const int64_t first = group_index * plan.n_splits;
    const Task task = task_of(plan, first);
    for (int64_t r = 0; r < (task.t1 - task.t0) * plan.group; ++r) {
      RowState merged;
      for (int64_t s = 0; s < plan.n_splits; ++s) merged.max = std::max(merged.max, states[(first + s) * rows + r].max);
      float* out = acc.data() + (first * rows + r) * plan.v_floats;  // the first split's accumulator
      const float first_scale = std::exp(states[first * rows + r].max - merged.max);
      merged.sum = states[first * rows + r].sum * first_scale;
      for (int32_t i = 0; i < plan.v_floats; ++i) out[i] *= first_scale;
      for (int64_t s = 1; s < plan.n_splits; ++s) {
        const RowState& part = states[(first + s) * rows + r];
        if (part.sum == 0) continue;
        const float scale = std::exp(part.max - merged.max);
        const float* in = acc.data() + ((first + s) * rows + r) * plan.v_floats;
        merged.sum += part.sum * scale;
        for (int32_t i = 0; i < plan.v_floats; ++i) out[i] += scale * in[i];
      }
      finish_row(plan, merged, out, task.t0 + r / plan.group, head_of(plan, task, r));
    }
  });
}

}  // namespace sparrow::cpu
#endif  // HWY_ONCE
