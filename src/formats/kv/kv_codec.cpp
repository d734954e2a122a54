#include "formats/kv/kv_codec.h"

#include <array>

#include "formats/kv/codec_registry.h"
#include "util/error.h"

namespace sparrow::formats {
namespace {

const std::array<KvCodecInfo, 15>& registry() {
  static const std::array<KvCodecInfo, 15> codecs = {
      f16_codec(),  bf16_codec(),  q8_0_codec(), q4_0_codec(), tbq2_codec(), tbq3_codec(),  tbq4_codec(),
      tbq3p_codec(), tbq4p_codec(), tcq2_codec(), tcq3_codec(), tcq4_codec(), qjl_codec(),  polar4_codec(),
      f32_codec(),
  };
  return codecs;
}

}  // namespace

std::span<const KvCodecInfo> kv_codecs() { return registry(); }

const KvCodecInfo& kv_codec_info(KvCodec codec) {
  const auto& all = registry();
  const size_t i = static_cast<size_t>(codec);
  if (i >= all.size() || all[i].codec != codec) throw Error("kv codec registry: entry out of enum order");
  return all[i];
}

std::optional<KvCodec> parse_kv_codec(std::string_view name) {
  for (const KvCodecInfo& info : registry())
    if (info.name == name) return info.codec;
  return std::nullopt;
}

}  // namespace sparrow::formats
