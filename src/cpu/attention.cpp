#include "cpu/attention.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "formats/weight_formats.h"
#include "util/error.h"

namespace sparrow::cpu {
namespace {

size_t row_bytes(const KvLayerView& kv) { return tensor_row_bytes(kv.type, kv.head_dim); }

// Row (position, kv_head) of a K or V array.
const uint8_t* cache_row(const void* base, const KvLayerView& kv, int64_t position, int32_t kv_head) {
  const int64_t slot = position % kv.capacity;
  return static_cast<const uint8_t*>(base) + (slot * kv.n_kv_heads + kv_head) * row_bytes(kv);
}

void store_row(const KvLayerView& kv, void* base, const float* src, int64_t position, int32_t kv_head) {
  uint8_t* dst = const_cast<uint8_t*>(cache_row(base, kv, position, kv_head));
  if (kv.type == TensorType::F32) {
    std::memcpy(dst, src, kv.head_dim * sizeof(float));
  } else {
    formats::quantize_row(kv.type, src, dst, kv.head_dim);
  }
}

void load_row(const KvLayerView& kv, const uint8_t* row, float* out) {
  if (kv.type == TensorType::F32) std::memcpy(out, row, kv.head_dim * sizeof(float));
  else formats::dequantize_row(kv.type, row, out, kv.head_dim);
}

float dot(const float* a, const float* b, int32_t n) {
  float s = 0;
  for (int32_t i = 0; i < n; ++i) s += a[i] * b[i];
  return s;
}

// Online softmax (Milakov & Gimelshein 2018) over the visible keys of one query row.
void attend_one(const AttentionArgs& a, int64_t token, int32_t head, float* k_row, float* v_row) {
  const KvLayerView& kv = a.kv;
  const int32_t d = kv.head_dim;
  const int32_t kv_head = head / (a.n_heads / kv.n_kv_heads);
  const float* q = a.q + (token * a.n_heads + head) * int64_t(d);
  float* out = a.out + (token * a.n_heads + head) * int64_t(d);
  const int64_t position = a.first_position + token;
  const int64_t first_key = a.sliding_window > 0 ? std::max<int64_t>(0, position - a.sliding_window + 1) : 0;

  float running_max = -std::numeric_limits<float>::infinity();
  float running_sum = 0;
  std::fill(out, out + d, 0.0f);
  for (int64_t p = first_key; p <= position; ++p) {
    load_row(kv, cache_row(kv.k, kv, p, kv_head), k_row);
    const float score = a.scale * dot(q, k_row, d);
    if (score > running_max) {
      const float correction = std::exp(running_max - score);
      running_sum *= correction;
      for (int32_t i = 0; i < d; ++i) out[i] *= correction;
      running_max = score;
    }
    const float w = std::exp(score - running_max);
    running_sum += w;
    load_row(kv, cache_row(kv.v, kv, p, kv_head), v_row);
    for (int32_t i = 0; i < d; ++i) out[i] += w * v_row[i];
  }
  const float inv = 1.0f / running_sum;
  for (int32_t i = 0; i < d; ++i) out[i] *= inv;
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
  const int64_t n_rows = a.n_tokens * a.n_heads;
  std::vector<std::vector<float>> scratch(pool.size(), std::vector<float>(2 * a.kv.head_dim));
  pool.parallel_for(n_rows, [&](int64_t row, int thread) {
    float* k_row = scratch[thread].data();
    attend_one(a, row / a.n_heads, int32_t(row % a.n_heads), k_row, k_row + a.kv.head_dim);
  });
}

}  // namespace sparrow::cpu
