#pragma once
// One entry per codec family, defined in that family's optimized file under src/cpu/kv/; cpu_kv_codecs.cpp
// lists the codecs. Each returns the codec's ops and expand (cpu_kv_codecs.h) on the SIMD target chosen at the
// call (cpu/kv/dispatched_codec.h); every op throws sparrow::Error for an unsupported head dim.
#include "cpu/kv/dispatched_codec.h"
#include "formats/kv/kv_codec.h"

namespace sparrow::cpu {

const CodecKernels& stock_kernels(formats::KvCodec codec);  // stock_codecs.cpp: f32, f16, bf16, q8_0, q4_0
const CodecKernels& tbq_kernels(int bits);                   // turboquant.cpp: tbq2, tbq3, tbq4
const CodecKernels& tbq_prod_kernels(int bits);              // turboquant_ip.cpp: tbq3p, tbq4p
const CodecKernels& tcq_kernels(int bits);                   // trellis.cpp: tcq2, tcq3, tcq4
const CodecKernels& qjl_kernels();                           // qjl.cpp
const CodecKernels& polar4_kernels();                        // polar.cpp

}  // namespace sparrow::cpu
