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

namespace {

const CodecKernels& kernels(formats::KvCodec codec) {
  using formats::KvCodec;
  switch (codec) {
    case KvCodec::F16:
    case KvCodec::BF16:
    case KvCodec::Q8_0:
    case KvCodec::Q4_0:
    case KvCodec::F32: return stock_kernels(codec);
    case KvCodec::TBQ2: return tbq_kernels(2);
    case KvCodec::TBQ3: return tbq_kernels(3);
    case KvCodec::TBQ4: return tbq_kernels(4);
    case KvCodec::TBQ3P: return tbq_prod_kernels(3);
    case KvCodec::TBQ4P: return tbq_prod_kernels(4);
    case KvCodec::TCQ2: return tcq_kernels(2);
    case KvCodec::TCQ3: return tcq_kernels(3);
    case KvCodec::TCQ4: return tcq_kernels(4);
    case KvCodec::QJL: return qjl_kernels();
    case KvCodec::POLAR4: return polar4_kernels();
  }
  throw Error("kv codec id " + std::to_string(int(codec)) + " is not a KV codec");
}

}  // namespace

const formats::KvCodecOps& kv_codec_ops(formats::KvCodec codec) { return kernels(codec).ops; }
ExpandBlocks kv_expand_blocks(formats::KvCodec codec) { return kernels(codec).expand; }

}  // namespace sparrow::cpu
