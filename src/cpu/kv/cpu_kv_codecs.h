#pragma once
// Optimized CPU implementations (Google Highway, dynamic dispatch) of every KV codec's ops, on the same bytes
// as the references in formats/kv/. `sparrow verify --backend cpu` checks each against its reference.
#include "formats/kv/kv_codec.h"

namespace sparrow::cpu {

// The optimized ops of a codec. Every codec has one: there is no "unsupported" entry. They run on the SIMD
// target chosen when this is called; a test that switches targets asks again.
const formats::KvCodecOps& kv_codec_ops(formats::KvCodec codec);

// Attention's batched view of a codec: n consecutive blocks (block_bytes(d) apart) -> n rows of the codec's
// basis, query_floats(d) floats each, such that score(q', block j) == <q', rows[j]> and
// accumulate(w, block j, acc) adds w * rows[j]. One call expands a tile of keys or values that every query
// row of an attention task then shares.
using ExpandBlocks = void (*)(const uint8_t* blocks, int n, int d, float* rows);
ExpandBlocks kv_expand_blocks(formats::KvCodec codec);

}  // namespace sparrow::cpu
