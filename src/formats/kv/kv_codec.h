#pragma once
// KV-cache codecs: how one head vector (K or V of one token and KV head, d = head dim in {64,128,256,512})
// becomes a few bytes, and what attention needs from those bytes without rebuilding the cache.
// Summary of the codecs: docs/kv-codecs.md. Every codec is defined once here (layout, constants, reference ops); the
// optimized CPU (src/cpu/kv/) and CUDA kernels implement the same ops on the same bytes and are verified
// against these references by `sparrow verify`.
//
// The ops, for a codec C and head dim d:
//   encode(x[d]) -> block                    on cache write
//   decode(block) -> x^[d]                   reference and tests
//   prepare_query(q[d]) -> q'[query_floats]  once per attention step (rotate, sketch, ...)
//   score(q', block) -> <q, x^>              K side
//   accumulate(w, block, acc[acc_floats])    V side: acc += w * x^, in the codec's own basis
//   finish(acc) -> out[d]                    V side: undo the basis once per output row
//
// Every codec's score and accumulate are linear in one "basis row" of the block (query_floats ==
// accumulator_floats): score(q', b) = <q', row(b)> and accumulate(w, b, acc) adds w * row(b). Attention
// kernels use that to expand a tile of blocks once and share it across every query row that reads it.
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string_view>

namespace sparrow::formats {

enum class KvCodec : uint8_t {
  F16, BF16, Q8_0, Q4_0,   // stock, llama.cpp-compatible block layouts
  TBQ2, TBQ3, TBQ4,        // TurboQuant MSE: randomized Hadamard + Lloyd-Max codebook + sub-block norm
  TBQ3P, TBQ4P,            // TurboQuant inner-product: (b-1)-bit MSE + 1-bit QJL sketch of the residual
  TCQ2, TCQ3, TCQ4,        // trellis-coded TurboQuant (Viterbi encode, sliding-window decode)
  QJL,                     // 1-bit Johnson-Lindenstrauss key sketch + norm (keys only)
  POLAR4,                  // PolarQuant: rotation + 4-level recursive polar transform
  F32,                     // uncompressed (reference runs and llama.cpp parity with an f32 cache)
};

struct KvCodecOps {
  void (*encode)(const float* x, int d, uint8_t* block);
  void (*decode)(const uint8_t* block, int d, float* x);
  void (*prepare_query)(const float* q, int d, float* prepared);
  float (*score)(const float* prepared, const uint8_t* block, int d);
  void (*accumulate)(float w, const uint8_t* block, int d, float* acc);
  void (*finish)(const float* acc, int d, float* out);
};

struct KvCodecInfo {
  KvCodec codec;
  std::string_view name;                   // "tbq4": the -ctk/-ctv spelling
  bool keys_only;                          // usable for K only (qjl)
  size_t (*block_bytes)(int d);            // bytes of one encoded head vector
  size_t (*query_floats)(int d);           // floats of a prepared query
  size_t (*accumulator_floats)(int d);     // floats of a V accumulator
  const KvCodecOps* reference;             // scalar, obviously correct
};

// Every codec, in enum order.
std::span<const KvCodecInfo> kv_codecs();
const KvCodecInfo& kv_codec_info(KvCodec codec);
std::optional<KvCodec> parse_kv_codec(std::string_view name);
constexpr int kMaxKvHeadDim = 512;
inline bool kv_head_dim_supported(int d) { return d == 64 || d == 128 || d == 256 || d == 512; }
inline double kv_bits_per_element(KvCodec codec, int d) {
  return 8.0 * double(kv_codec_info(codec).block_bytes(d)) / d;
}

}  // namespace sparrow::formats
