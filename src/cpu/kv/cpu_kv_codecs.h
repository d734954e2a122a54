#pragma once
// Optimized CPU implementations (Google Highway, dynamic dispatch) of every KV codec's ops, on the same bytes
// as the references in formats/kv/. `sparrow verify --backend cpu` checks each against its reference.
#include "formats/kv/kv_codec.h"

namespace sparrow::cpu {

// The optimized ops of a codec. Every codec has one: there is no "unsupported" entry.
const formats::KvCodecOps& kv_codec_ops(formats::KvCodec codec);

}  // namespace sparrow::cpu
