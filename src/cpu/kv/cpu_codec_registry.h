#pragma once
// One entry per codec, defined in that codec's optimized file under src/cpu/kv/; cpu_kv_codecs.cpp lists them.
// <codec>_ops: the codec's optimized ops, those of the SIMD target chosen at the call (cpu/kv/dispatched_codec.h).
// <codec>_expand: n consecutive blocks (block_bytes(d) apart) -> n rows of query_floats(d) floats, row j =
// accumulate(1, block j) from zero (cpu_kv_codecs.h, ExpandBlocks); throws sparrow::Error for an unsupported
// head dim.
#include <cstdint>

#include "formats/kv/kv_codec.h"

namespace sparrow::cpu {

const formats::KvCodecOps& f32_ops();     // stock_codecs.cpp
const formats::KvCodecOps& f16_ops();
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

void f32_expand(const uint8_t* blocks, int n, int d, float* rows);     // stock_codecs.cpp
void f16_expand(const uint8_t* blocks, int n, int d, float* rows);
void bf16_expand(const uint8_t* blocks, int n, int d, float* rows);
void q8_0_expand(const uint8_t* blocks, int n, int d, float* rows);
void q4_0_expand(const uint8_t* blocks, int n, int d, float* rows);
void tbq2_expand(const uint8_t* blocks, int n, int d, float* rows);    // turboquant.cpp
void tbq3_expand(const uint8_t* blocks, int n, int d, float* rows);
void tbq4_expand(const uint8_t* blocks, int n, int d, float* rows);
void tbq3p_expand(const uint8_t* blocks, int n, int d, float* rows);   // turboquant_ip.cpp
void tbq4p_expand(const uint8_t* blocks, int n, int d, float* rows);
void tcq2_expand(const uint8_t* blocks, int n, int d, float* rows);    // trellis.cpp
void tcq3_expand(const uint8_t* blocks, int n, int d, float* rows);
void qjl_expand(const uint8_t* blocks, int n, int d, float* rows);     // qjl.cpp
void polar4_expand(const uint8_t* blocks, int n, int d, float* rows);  // polar.cpp

}  // namespace sparrow::cpu
