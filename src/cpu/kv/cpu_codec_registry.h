#pragma once
// One entry per codec, defined in that codec's optimized file under src/cpu/kv/; cpu_kv_codecs.cpp lists them.
#include "formats/kv/kv_codec.h"

namespace sparrow::cpu {

const formats::KvCodecOps& f16_ops();     // stock_codecs.cpp
const formats::KvCodecOps& bf16_ops();
const formats::KvCodecOps& q8_0_ops();
const formats::KvCodecOps& q4_0_ops();
const formats::KvCodecOps& tbq2_ops();    // turboquant.cpp
const formats::KvCodecOps& tbq3_ops();
const formats::KvCodecOps& tbq4_ops();
const formats::KvCodecOps& tbq3p_ops();   // turboquant_ip.cpp
const formats::KvCodecOps& tbq4p_ops();
const formats::KvCodecOps& tcq2_ops();    // trellis.cpp
const formats::KvCodecOps& tcq3_ops();
const formats::KvCodecOps& qjl_ops();     // qjl.cpp
const formats::KvCodecOps& polar4_ops();  // polar.cpp

}  // namespace sparrow::cpu
