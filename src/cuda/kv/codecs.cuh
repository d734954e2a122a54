#pragma once
// The one switch over codecs on the device side: with_device_codec (src/cuda/kv/device_codec.cuh) for every
// codec that has a DeviceCodec.
#include <string>
#include <type_traits>

#include "cuda/kv/device_codec.cuh"
#include "cuda/kv/stock.cuh"
#include "util/error.h"

namespace sparrow::cuda {

template <class F>
void with_device_codec(formats::KvCodec codec, F&& f) {
  using formats::KvCodec;
  switch (codec) {
    case KvCodec::F32: f(std::integral_constant<KvCodec, KvCodec::F32>{}); return;
    case KvCodec::F16: f(std::integral_constant<KvCodec, KvCodec::F16>{}); return;
    default:
      throw Error("CUDA: kv codec " + std::string(formats::kv_codec_info(codec).name) +
                  " has no device implementation");
  }
}

}  // namespace sparrow::cuda
