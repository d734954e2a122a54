#pragma once
// The C API's spelling of KV cache options, shared by every tool: codec names ("tbq4") and the per-layer
// override grammar of --kv-layers ("0-3:q8_0/tbq4,7:f16": layers:K/V, or layers:C for both).
#include <optional>
#include <string>
#include <vector>

#include "formats/kv/kv_codec.h"
#include "kv/kv_cache.h"

namespace sparrow {

// A codec name given for `option` (-ctk, -ctv...) -> the codec; throws sparrow::Error naming the option and
// listing the codecs otherwise, or if a keys-only codec is given for values.
formats::KvCodec parse_kv_codec_option(const std::string& name, const char* option, bool for_values);
// As parse_kv_codec_option, but "auto" (the default of -ctk / -ctv) -> empty: the kernel decisions choose per
// layer (runtime/kv_auto.h).
std::optional<formats::KvCodec> parse_kv_codec_choice(const std::string& name, const char* option, bool for_values);
// "0-3:q8_0/tbq4,7:f16" -> overrides; throws sparrow::Error on bad syntax or an unknown codec.
std::vector<KvLayerOverride> parse_kv_layers(const std::string& spec);

}  // namespace sparrow
