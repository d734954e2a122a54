#pragma once
// What `sparrow mkmodel` writes for a preset, in llama.cpp's exact layout (tensor names, shapes, types and
// metadata keys of llama.cpp's HF converter and llama-quantize): the metadata, derived from the preset's
// ModelConfig so that ModelConfig::from_gguf reads the same config back, and every tensor with the distribution
// its values are drawn from. mkmodel.cpp draws the values and streams them to disk.
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "gguf/gguf.h"
#include "gguf/tensor_types.h"
#include "mkmodel_presets.h"
#include "model/config.h"

namespace sparrow::tools::mkmodel {

struct WeightType {
  std::string name;         // as given to --type
  TensorType type;          // what 2-D weights become when their rows allow it
  uint32_t file_type;       // llama_ftype written to general.file_type
  bool via_llama_quantize;  // only llama-quantize makes it (not the HF converter): see per_layer_model_proj
};

// Throws "--type: unknown weight type ..." naming the types there are.
const WeightType& find_weight_type(const std::string& name);

// How a tensor's values are drawn.
struct Fill {
  enum class Kind { Gaussian, Uniform, Values };
  Kind kind = Kind::Gaussian;
  float center = 0;           // mean
  float spread = 0;           // Gaussian: standard deviation; Uniform: half width
  std::vector<float> values;  // Kind::Values: the exact contents

  static Fill gaussian(float stddev) { return {.kind = Kind::Gaussian, .spread = stddev}; }
  static Fill uniform(float center, float half_width) {
    return {.kind = Kind::Uniform, .center = center, .spread = half_width};
  }
  static Fill exact(std::vector<float> v) { return {.kind = Kind::Values, .values = std::move(v)}; }
};

struct PlannedTensor {
  std::string name;
  TensorType type;
  std::vector<int64_t> ne;
  Fill fill;
};

struct Vocabulary {
  uint64_t n_tokens = 0;
  std::vector<gguf::Writer::Entry> keys;  // every tokenizer.* key of the source file
};

struct ModelPlan {
  gguf::Writer writer;                 // every key set and every tensor declared, in the file's order
  std::vector<PlannedTensor> tensors;  // the declared tensors, in the same order
};

ModelPlan plan_model(const Preset& preset, const WeightType& weight_type, uint64_t seed, const Vocabulary& vocab);

// The "<arch>.*" hyperparameter keys of `config`, in the order llama.cpp's HF converter writes them. Throws when
// the config holds what those keys cannot say (values that differ between layers the file gives one key, Gemma 3
// values llama.cpp hard-codes). Fields readers derive from the architecture (attention scale, V normalization,
// proportional RoPE, KV sources) are not written.
void add_architecture_metadata(const ModelConfig& config, gguf::Writer& writer);

}  // namespace sparrow::tools::mkmodel
