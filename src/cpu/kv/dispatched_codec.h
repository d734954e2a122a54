#pragma once
// How an optimized KV codec reaches the best SIMD target, written once for every codec that uses it. A codec
// file compiles its kernels once per target (hwy/foreach_target.h), wraps them in CheckedKernels (which checks
// the head dim, then calls the kernel directly) and exports one function returning the target's CodecKernels
// table. The registry entries (cpu_codec_registry.h) hand out the table of the target chosen when they are
// called, so an op call is one indirect call and one direct one, with no dispatch of its own; code that
// switches targets (tests) asks for the ops again after switching. The checks are compiled for the baseline
// target, so the kernels they call must not be HWY_INLINE (that forces inlining across targets).
#include <cstdint>
#include <string_view>

#include "cpu/kv/cpu_kv_codecs.h"
#include "formats/kv/kv_codec.h"
#include "formats/kv/rotation.h"

namespace sparrow::cpu {

// One SIMD target's ops and expand of one codec.
struct CodecKernels {
  formats::KvCodecOps ops;
  ExpandBlocks expand;
};

// Throws sparrow::Error "kv codec <codec> <op>: head dim <d> is not supported (expected 64, 128, 256 or 512)".
[[noreturn]] void throw_unsupported_head_dim(std::string_view codec, const char* op, int d);

// The kernels of the codec kInfo() on one target (they trust d), each behind a head-dim check.
template <const formats::KvCodecInfo& (*kInfo)(), auto kEncode, auto kDecode, auto kPrepareQuery, auto kScore,
          auto kAccumulate, auto kFinish, auto kExpand>
class CheckedKernels {
  static void check(const char* op, int d) {
    if (!formats::kv_head_dim_supported(d)) throw_unsupported_head_dim(kInfo().name, op, d);
  }
  static void encode(const float* x, int d, uint8_t* block) {
    check("encode", d);
    kEncode(x, d, block);
  }
  static void decode(const uint8_t* block, int d, float* x) {
    check("decode", d);
    kDecode(block, d, x);
  }
  static void prepare_query(const float* q, int d, float* prepared) {
    check("prepare_query", d);
    kPrepareQuery(q, d, prepared);
  }
  static float score(const float* prepared, const uint8_t* block, int d) {
    check("score", d);
    return kScore(prepared, block, d);
  }
  static void accumulate(float w, const uint8_t* block, int d, float* acc) {
    check("accumulate", d);
    kAccumulate(w, block, d, acc);
  }
  static void finish(const float* acc, int d, float* out) {
    check("finish", d);
    kFinish(acc, d, out);
  }
  static void expand(const uint8_t* blocks, int n, int d, float* rows) {
    check("expand", d);
    kExpand(blocks, n, d, rows);
  }

 public:
  static constexpr CodecKernels kTable{{encode, decode, prepare_query, score, accumulate, finish}, expand};
};

// Encode and decode of a codec that quantizes the rotated vector R x (formats/kv/rotation.h, the shared scalar
// rotation) with a target's kernel: R x, then the kernel (which may overwrite R x); the kernel, then R^T.
template <auto kEncodeRotated>
void encode_rotating(const float* x, int d, uint8_t* block) {
  float y[formats::kMaxKvHeadDim];
  formats::hadamard_rotate(x, d, y);
  kEncodeRotated(y, d, block);
}

template <void (*kDecodeRotated)(const uint8_t*, int, float*)>
void decode_rotating(const uint8_t* block, int d, float* x) {
  kDecodeRotated(block, d, x);
  formats::hadamard_unrotate(x, d, x);
}

}  // namespace sparrow::cpu
