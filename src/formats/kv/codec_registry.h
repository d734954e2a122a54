#pragma once
// One entry per codec, defined in that codec's own file; kv_codec.cpp lists them in enum order.
#include "formats/kv/kv_codec.h"

namespace sparrow::formats {

const KvCodecInfo& f16_codec();     // stock_codecs.cpp
const KvCodecInfo& bf16_codec();
const KvCodecInfo& q8_0_codec();
const KvCodecInfo& q4_0_codec();
const KvCodecInfo& tbq2_codec();    // turboquant.cpp
const KvCodecInfo& tbq3_codec();
const KvCodecInfo& tbq4_codec();
const KvCodecInfo& tbq3p_codec();   // turboquant_ip.cpp
const KvCodecInfo& tbq4p_codec();
const KvCodecInfo& tcq2_codec();    // trellis.cpp
const KvCodecInfo& tcq3_codec();
const KvCodecInfo& tcq4_codec();
const KvCodecInfo& qjl_codec();     // qjl.cpp
const KvCodecInfo& polar4_codec();  // polar.cpp
const KvCodecInfo& f32_codec();     // stock_codecs.cpp

}  // namespace sparrow::formats
