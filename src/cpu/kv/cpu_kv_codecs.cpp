// The optimized CPU ops and expand of every KV codec, in enum order; each is defined in its codec's file under
// src/cpu/kv/ (cpu_codec_registry.h). `sparrow verify --backend cpu` checks every entry against its reference.
#include "cpu/kv/cpu_kv_codecs.h"

#include <string>

#include "cpu/kv/cpu_codec_registry.h"
#include "cpu/kv/dispatched_codec.h"
#include "util/error.h"

namespace sparrow::cpu {

void throw_unsupported_head_dim(std::string_view codec, const char* op, int d) {
  throw Error("kv codec " + std::string(codec) + " " + op + ": head dim " + std::to_string(d) +
              " is not supported (expected 64, 128, 256 or 512)");
}

const formats::KvCodecOps& kv_codec_ops(formats::KvCodec codec) {
  using formats::KvCodec;
  switch (codec) {
    case KvCodec::F16: return f16_ops();
    case KvCodec::BF16: return bf16_ops();
    case KvCodec::Q8_0: return q8_0_ops();
    case KvCodec::Q4_0: return q4_0_ops();
    case KvCodec::TBQ2: return tbq2_ops();
    case KvCodec::TBQ3: return tbq3_ops();
    case KvCodec::TBQ4: return tbq4_ops();
    case KvCodec::TBQ3P: return tbq3p_ops();
    case KvCodec::TBQ4P: return tbq4p_ops();
    case KvCodec::TCQ2: return tcq2_ops();
    case KvCodec::TCQ3: return tcq3_ops();
    case KvCodec::QJL: return qjl_ops();
    case KvCodec::POLAR4: return polar4_ops();
    case KvCodec::F32: return f32_ops();
  }
  throw Error("kv_codec_ops: codec id " + std::to_string(int(codec)) + " is not a KV codec");
}

ExpandBlocks kv_expand_blocks(formats::KvCodec codec) {
  using formats::KvCodec;
  switch (codec) {
    case KvCodec::F16: return f16_expand;
    case KvCodec::BF16: return bf16_expand;
    case KvCodec::Q8_0: return q8_0_expand;
    case KvCodec::Q4_0: return q4_0_expand;
    case KvCodec::TBQ2: return tbq2_expand;
    case KvCodec::TBQ3: return tbq3_expand;
    case KvCodec::TBQ4: return tbq4_expand;
    case KvCodec::TBQ3P: return tbq3p_expand;
    case KvCodec::TBQ4P: return tbq4p_expand;
    case KvCodec::TCQ2: return tcq2_expand;
    case KvCodec::TCQ3: return tcq3_expand;
    case KvCodec::QJL: return qjl_expand;
    case KvCodec::POLAR4: return polar4_expand;
    case KvCodec::F32: return f32_expand;
  }
  throw Error("kv_expand_blocks: codec id " + std::to_string(int(codec)) + " is not a KV codec");
}

}  // namespace sparrow::cpu
