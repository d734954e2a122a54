#pragma once
// The models `sparrow mkmodel` can write, each a ModelConfig: the published Gemma 3 / Gemma 4 shapes and tiny
// ones that keep each mechanism (sliding/global layers, GQA, PLE, shared KV, k_eq_v, per-layer KV head counts,
// double-wide MLP) at a size the test suite can write in a second or two. docs/mkmodel.md tabulates them.
#include <string>
#include <vector>

#include "model/config.h"

namespace sparrow::tools::mkmodel {

struct Preset {
  std::string name;
  ModelConfig config;   // n_vocab is 0: the vocabulary mkmodel copies decides it
  bool k_eq_v = false;  // Gemma 4: global layers have no attn_v (V is the raw K projection)
};

const std::vector<Preset>& all_presets();
// "tiny, 270m, 1b": the presets of one architecture ("gemma3" or "gemma4"), for help and error messages.
std::string preset_names(const std::string& arch_name);
// Throws "--preset: no preset ..." naming the presets there are.
const Preset& find_preset(const std::string& arch_name, const std::string& name);

}  // namespace sparrow::tools::mkmodel
