// Attention over the KV cache on the CPU. Work is split into (KV head, tile of query tokens) tasks; a task
// walks the visible keys once, converting each K and V row to float once for all of its query rows (every
// query head of the GQA group times every token of the tile), and keeps an online softmax per row
// (Milakov & Gimelshein 2018): no score matrix, no decoded copy of the cache. Vector loops through Highway.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "cpu/attention.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep

#include <hwy/highway.h>

#include "formats/weight_formats.h"

HWY_BEFORE_NAMESPACE();
namespace sparrow::cpu::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

float Dot(const float* a, const float* b, int32_t n) {
  const hn::ScalableTag<float> d;
  const int32_t N = int32_t(hn::Lanes(d));
  auto acc0 = hn::Zero(d), acc1 = hn::Zero(d);
  int32_t i = 0;
  for (; i + 2 * N <= n; i += 2 * N) {
    acc0 = hn::MulAdd(hn::LoadU(d, a + i), hn::LoadU(d, b + i), acc0);
    acc1 = hn::MulAdd(hn::LoadU(d, a + i + N), hn::LoadU(d, b + i + N), acc1);
  }
  for (; i + N <= n; i += N) acc0 = hn::MulAdd(hn::LoadU(d, a + i), hn::LoadU(d, b + i), acc0);
  float s = hn::GetLane(hn::SumOfLanes(d, hn::Add(acc0, acc1)));
  for (; i < n; ++i) s += a[i] * b[i];
  return s;
}

// y = y * scale + w * x
void ScaleAdd(float* y, float scale, float w, const float* x, int32_t n) {
  const hn::ScalableTag<float> d;
  const int32_t N = int32_t(hn::Lanes(d));
  const auto vs = hn::Set(d, scale), vw = hn::Set(d, w);
  int32_t i = 0;
  for (; i + N <= n; i += N) hn::StoreU(hn::MulAdd(vw, hn::LoadU(d, x + i), hn::Mul(vs, hn::LoadU(d, y + i))), d, y + i);
  for (; i < n; ++i) y[i] = y[i] * scale + w * x[i];
}

void HalfToFloat(const uint16_t* src, float* dst, int32_t n) {
  const hn::ScalableTag<float> d;
  const hn::Rebind<hwy::float16_t, decltype(d)> dh;
  const int32_t N = int32_t(hn::Lanes(d));
  const auto* h = reinterpret_cast<const hwy::float16_t*>(src);
  int32_t i = 0;
  for (; i + N <= n; i += N) hn::StoreU(hn::PromoteTo(d, hn::LoadU(dh, h + i)), d, dst + i);
  for (; i < n; ++i) dst[i] = formats::f16_to_f32(src[i]);
}

}  // namespace sparrow::cpu::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "cpu/attention.h"
#include "formats/weight_formats.h"
#include "util/error.h"

namespace sparrow::cpu {

HWY_EXPORT(Dot);
HWY_EXPORT(ScaleAdd);
HWY_EXPORT(HalfToFloat);

namespace {

constexpr int64_t kTileTokens = 16;

size_t row_bytes(const KvLayerView& kv) { return tensor_row_bytes(kv.type, kv.head_dim); }

// Row (position, kv_head) of a K or V array.
const uint8_t* cache_row(const void* base, const KvLayerView& kv, int64_t position, int32_t kv_head) {
  const int64_t slot = position % kv.capacity;
  return static_cast<const uint8_t*>(base) + (slot * kv.n_kv_heads + kv_head) * row_bytes(kv);
}

void store_row(const KvLayerView& kv, void* base, const float* src, int64_t position, int32_t kv_head) {
  uint8_t* dst = const_cast<uint8_t*>(cache_row(base, kv, position, kv_head));
  if (kv.type == TensorType::F32) std::memcpy(dst, src, kv.head_dim * sizeof(float));
  else formats::quantize_row(kv.type, src, dst, kv.head_dim);
}

void load_row(const KvLayerView& kv, const uint8_t* row, float* out) {
  if (kv.type == TensorType::F32) std::memcpy(out, row, kv.head_dim * sizeof(float));
  else if (kv.type == TensorType::F16)
    HWY_DYNAMIC_DISPATCH(HalfToFloat)(reinterpret_cast<const uint16_t*>(row), out, kv.head_dim);
  else formats::dequantize_row(kv.type, row, out, kv.head_dim);
}

// One query row's online-softmax state.
struct RowState {
  const float* q;
  float* out;
  int64_t position;
  int64_t first_key;
  float max = -std::numeric_limits<float>::infinity();
  float sum = 0;
};

void attend_tile(const AttentionArgs& a, int32_t kv_head, int64_t t0, int64_t t1, std::vector<RowState>& rows,
                 float* k_row, float* v_row) {
  const KvLayerView& kv = a.kv;
  const int32_t d = kv.head_dim;
  const int32_t group = a.n_heads / kv.n_kv_heads;
  rows.clear();
  for (int64_t t = t0; t < t1; ++t) {
    const int64_t position = a.first_position + t;
    const int64_t first_key = a.sliding_window > 0 ? std::max<int64_t>(0, position - a.sliding_window + 1) : 0;
    for (int32_t h = kv_head * group; h < (kv_head + 1) * group; ++h) {
      const int64_t offset = (t * a.n_heads + h) * int64_t(d);
      std::fill(a.out + offset, a.out + offset + d, 0.0f);
      rows.push_back({a.q + offset, a.out + offset, position, first_key});
    }
  }
  const auto dot = HWY_DYNAMIC_DISPATCH(Dot);
  const auto scale_add = HWY_DYNAMIC_DISPATCH(ScaleAdd);
  const int64_t first = rows.front().first_key, last = rows.back().position;
  for (int64_t p = first; p <= last; ++p) {
    load_row(kv, cache_row(kv.k, kv, p, kv_head), k_row);
    load_row(kv, cache_row(kv.v, kv, p, kv_head), v_row);
    for (RowState& r : rows) {
      if (p < r.first_key || p > r.position) continue;
      const float score = a.scale * dot(r.q, k_row, d);
      float correction = 1.0f;
      if (score > r.max) {
        correction = std::exp(r.max - score);
        r.sum *= correction;
        r.max = score;
      }
      const float w = std::exp(score - r.max);
      r.sum += w;
      scale_add(r.out, correction, w, v_row, d);
    }
  }
  for (RowState& r : rows) {
    const float inv = 1.0f / r.sum;
    for (int32_t i = 0; i < d; ++i) r.out[i] *= inv;
  }
}

}  // namespace

void kv_store(const KvLayerView& kv, const float* k, const float* v, int64_t n_tokens, int32_t first_position) {
  const int64_t row = int64_t(kv.n_kv_heads) * kv.head_dim;
  for (int64_t t = 0; t < n_tokens; ++t)
    for (int32_t h = 0; h < kv.n_kv_heads; ++h) {
      store_row(kv, kv.k, k + t * row + int64_t(h) * kv.head_dim, first_position + t, h);
      store_row(kv, kv.v, v + t * row + int64_t(h) * kv.head_dim, first_position + t, h);
    }
}

void attention(ThreadPool& pool, const AttentionArgs& a) {
  if (a.n_heads % a.kv.n_kv_heads != 0) throw Error("attention: n_heads must be a multiple of n_kv_heads");
  // Small tiles when there are few tokens, so that short prompts still spread over the threads.
  const int64_t tile = std::clamp<int64_t>(a.n_tokens / (2 * pool.size()), 1, kTileTokens);
  const int64_t n_tiles = (a.n_tokens + tile - 1) / tile;
  const int64_t n_tasks = n_tiles * a.kv.n_kv_heads;
  struct Scratch {
    std::vector<RowState> rows;
    std::vector<float> k_row, v_row;
  };
  std::vector<Scratch> scratch(pool.size());
  for (Scratch& s : scratch) {
    s.k_row.resize(a.kv.head_dim);
    s.v_row.resize(a.kv.head_dim);
  }
  pool.parallel_for(n_tasks, [&](int64_t task, int thread) {
    const int64_t t0 = (task / a.kv.n_kv_heads) * tile;
    Scratch& s = scratch[thread];
    attend_tile(a, int32_t(task % a.kv.n_kv_heads), t0, std::min(a.n_tokens, t0 + tile), s.rows, s.k_row.data(),
                s.v_row.data());
  });
}

}  // namespace sparrow::cpu
#endif  // HWY_ONCE
