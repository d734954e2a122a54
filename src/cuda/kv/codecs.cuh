#pragma once
// Every device codec (one header per family) and with_device_codec, the one switch from a runtime codec to
// DeviceCodec<C>. Kernels that read or write the cache include this header and launch through
// with_device_codec, which also binds this translation unit's codec tables (device_tables.cuh).
#include <string>
#include <type_traits>

#include "cuda/kv/device_codec.cuh"
#include "cuda/kv/device_tables.cuh"
#include "cuda/kv/polar.cuh"
#include "cuda/kv/qjl.cuh"
#include "cuda/kv/stock.cuh"
#include "cuda/kv/trellis.cuh"
#include "cuda/kv/turboquant.cuh"
#include "cuda/kv/turboquant_ip.cuh"
#include "util/error.h"

namespace sparrow::cuda {

// The codecs whose ops multiply by a QJL projection (its tables are uploaded on their first use).
constexpr bool device_codec_sketches(formats::KvCodec codec) {
  return codec == formats::KvCodec::QJL || codec == formats::KvCodec::TBQ3P || codec == formats::KvCodec::TBQ4P;
}

template <class F>
void with_device_codec(formats::KvCodec codec, F&& f) {
  using formats::KvCodec;
  kv::bind_device_kv_tables(device_codec_sketches(codec));
  switch (codec) {
    case KvCodec::F16: return f(std::integral_constant<KvCodec, KvCodec::F16>{});
    case KvCodec::BF16: return f(std::integral_constant<KvCodec, KvCodec::BF16>{});
    case KvCodec::Q8_0: return f(std::integral_constant<KvCodec, KvCodec::Q8_0>{});
    case KvCodec::Q4_0: return f(std::integral_constant<KvCodec, KvCodec::Q4_0>{});
    case KvCodec::TBQ2: return f(std::integral_constant<KvCodec, KvCodec::TBQ2>{});
    case KvCodec::TBQ3: return f(std::integral_constant<KvCodec, KvCodec::TBQ3>{});
    case KvCodec::TBQ4: return f(std::integral_constant<KvCodec, KvCodec::TBQ4>{});
    case KvCodec::TBQ3P: return f(std::integral_constant<KvCodec, KvCodec::TBQ3P>{});
    case KvCodec::TBQ4P: return f(std::integral_constant<KvCodec, KvCodec::TBQ4P>{});
    case KvCodec::TCQ2: return f(std::integral_constant<KvCodec, KvCodec::TCQ2>{});
    case KvCodec::TCQ3: return f(std::integral_constant<KvCodec, KvCodec::TCQ3>{});
    case KvCodec::TCQ4: return f(std::integral_constant<KvCodec, KvCodec::TCQ4>{});
    case KvCodec::QJL: return f(std::integral_constant<KvCodec, KvCodec::QJL>{});
    case KvCodec::POLAR4: return f(std::integral_constant<KvCodec, KvCodec::POLAR4>{});
    case KvCodec::F32: return f(std::integral_constant<KvCodec, KvCodec::F32>{});
  }
  throw Error("with_device_codec: codec id " + std::to_string(int(codec)) + " is not a KV codec");
}

}  // namespace sparrow::cuda
