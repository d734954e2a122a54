#pragma once
// How an optimized KV codec reaches the best SIMD target, written once for every codec that uses it. A codec
// file compiles its kernels once per target (hwy/foreach_target.h), collects them in one CodecKernels table
// per target and exports a function returning that table; DispatchedCodec turns it into the KvCodecOps and
// the expand function of cpu_codec_registry.h: each op checks the head dim, then calls the kernel of the
// target chosen at that moment (tests switch targets between calls).
#include <cstdint>
#include <string_view>

#include "cpu/kv/cpu_kv_codecs.h"
#include "formats/kv/kv_codec.h"

namespace sparrow::cpu {

// One SIMD target's kernels of one codec. They trust d: DispatchedCodec has checked it.
struct CodecKernels {
  formats::KvCodecOps ops;
  ExpandBlocks expand;
};

// Throws sparrow::Error "kv codec <codec> <op>: head dim <d> is not supported (expected 64, 128, 256 or 512)".
[[noreturn]] void throw_unsupported_head_dim(std::string_view codec, const char* op, int d);

// The checked, dispatched ops of the codec kInfo(), whose current target's kernels kKernels() returns.
template <const formats::KvCodecInfo& (*kInfo)(), const CodecKernels& (*kKernels)()>
class DispatchedCodec {
 public:
  static const formats::KvCodecOps& ops() {
    static constexpr formats::KvCodecOps kOps{encode, decode, prepare_query, score, accumulate, finish};
    return kOps;
  }

  static void expand(const uint8_t* blocks, int n, int d, float* rows) {
    check("expand", d);
    kKernels().expand(blocks, n, d, rows);
  }

 private:
  static void check(const char* op, int d) {
    if (!formats::kv_head_dim_supported(d)) throw_unsupported_head_dim(kInfo().name, op, d);
  }
  static void encode(const float* x, int d, uint8_t* block) {
    check("encode", d);
    kKernels().ops.encode(x, d, block);
  }
  static void decode(const uint8_t* block, int d, float* x) {
    check("decode", d);
    kKernels().ops.decode(block, d, x);
  }
  static void prepare_query(const float* q, int d, float* prepared) {
    check("prepare_query", d);
    kKernels().ops.prepare_query(q, d, prepared);
  }
  static float score(const float* prepared, const uint8_t* block, int d) {
    check("score", d);
    return kKernels().ops.score(prepared, block, d);
  }
  static void accumulate(float w, const uint8_t* block, int d, float* acc) {
    check("accumulate", d);
    kKernels().ops.accumulate(w, block, d, acc);
  }
  static void finish(const float* acc, int d, float* out) {
    check("finish", d);
    kKernels().ops.finish(acc, d, out);
  }
};

}  // namespace sparrow::cpu
