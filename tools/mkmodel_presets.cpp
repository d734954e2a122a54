#include "mkmodel_presets.h"

#include <cmath>
#include <cstdint>
#include <utility>

#include "util/error.h"

namespace sparrow::tools::mkmodel {
namespace {

// Rope bases of every Gemma 3 and Gemma 4 model: global layers 1e6, sliding layers 1e4.
constexpr float kGlobalRopeBase = 1e6f;
constexpr float kSlidingRopeBase = 1e4f;

// A Gemma 3 model: `model` states the model-wide sizes, and every layer has the KV heads and FFN width of
// `layer`. llama.cpp fixes the rest: head dim 256, and a global layer every 6th (its sliding pattern is
// hard-coded, never read from the file).
Preset gemma3(std::string name, ModelConfig model, const LayerConfig& layer) {
  constexpr int32_t kHeadDim = 256, kGlobalPeriod = 6;
  model.arch = Architecture::Gemma3;
  model.arch_name = "gemma3";
  model.attention_scale = 1.0f / std::sqrt(float(kHeadDim));  // query_pre_attn_scalar = head_dim
  for (int32_t il = 0; il < model.n_layer; ++il) {
    const bool sliding = il % kGlobalPeriod != kGlobalPeriod - 1;
    model.layers.push_back({
        .sliding = sliding,
        .head_dim = kHeadDim,
        .n_kv_heads = layer.n_kv_heads,
        .n_ff = layer.n_ff,
        .kv_source = il,
        .n_rot = kHeadDim,
        .rope_base = sliding ? kSlidingRopeBase : kGlobalRopeBase,
    });
  }
  return {.name = std::move(name), .config = std::move(model)};
}

// How a Gemma 4 model's layers differ. Head dims are 256 on sliding and 512 on global layers in every size.
struct Gemma4Layers {
  int32_t global_period = 0;  // layer il is global when il % global_period == global_period - 1
  int32_t n_kv_heads_sliding = 0;
  int32_t n_kv_heads_global = 0;
  int32_t n_ff = 0;
  bool double_wide_shared_ff = false;  // E2B's use_double_wide_mlp: KV-shared layers have twice the FFN width
  int32_t n_shared_kv_layers = 0;      // the last N layers read earlier layers' KV
  bool k_eq_v = false;
};

// A KV-shared layer reads the last layer of its own kind (sliding or global) that has KV of its own.
int32_t kv_source_layer(const std::vector<LayerConfig>& layers, int32_t first_shared, bool sliding) {
  for (int32_t il = first_shared - 1; il >= 0; --il) {
    if (layers[size_t(il)].sliding == sliding) return il;
  }
  throw Error("mkmodel preset: a KV-shared layer has no earlier layer of its kind");
}

LayerConfig gemma4_layer(const Gemma4Layers& layers, int32_t il, int32_t first_shared) {
  const bool sliding = il % layers.global_period != layers.global_period - 1;
  const bool shared = il >= first_shared;
  const int32_t head_dim = sliding ? 256 : 512;
  return {
      .sliding = sliding,
      .head_dim = head_dim,
      .n_kv_heads = sliding ? layers.n_kv_heads_sliding : layers.n_kv_heads_global,
      .n_ff = shared && layers.double_wide_shared_ff ? 2 * layers.n_ff : layers.n_ff,
      .owns_kv = !shared,
      .kv_source = il,
      .n_rot = head_dim,
      .rope_base = sliding ? kSlidingRopeBase : kGlobalRopeBase,
      .proportional_rope = !sliding,
  };
}

// A Gemma 4 model: `model` states the model-wide sizes, `layers` how its layers differ.
Preset gemma4(std::string name, ModelConfig model, const Gemma4Layers& layers) {
  model.arch = Architecture::Gemma4;
  model.arch_name = "gemma4";
  model.attention_scale = 1.0f;  // Gemma 4 scales q and k by their norms instead
  model.final_softcap = 30.0f;
  model.normalize_v = true;
  const int32_t first_shared = model.n_layer - layers.n_shared_kv_layers;
  for (int32_t il = 0; il < model.n_layer; ++il) {
    LayerConfig layer = gemma4_layer(layers, il, first_shared);
    if (!layer.owns_kv) layer.kv_source = kv_source_layer(model.layers, first_shared, layer.sliding);
    model.layers.push_back(layer);
  }
  return {.name = std::move(name), .config = std::move(model), .k_eq_v = layers.k_eq_v};
}

std::vector<Preset> make_presets() {
  return {
      // Gemma 3. tiny: 6 layers because llama.cpp's hard-coded pattern makes layer 5 the first global one; a
      // 16-token window so short prompts already exercise the sliding mask; 2 KV heads for 4 query heads (GQA).
      gemma3("tiny", {.n_layer = 6, .n_embd = 128, .n_heads = 4, .n_ctx_train = 8192, .sliding_window = 16},
             {.n_kv_heads = 2, .n_ff = 512}),
      gemma3("270m", {.n_layer = 18, .n_embd = 640, .n_heads = 4, .n_ctx_train = 32768, .sliding_window = 512},
             {.n_kv_heads = 1, .n_ff = 2048}),
      gemma3("1b", {.n_layer = 26, .n_embd = 1152, .n_heads = 4, .n_ctx_train = 32768, .sliding_window = 512},
             {.n_kv_heads = 1, .n_ff = 6912}),

      // Gemma 4 tiny presets: sliding S S G S S G (a global layer every third), window 16.
      // E2B shrunk: PLE, MQA, and the last 3 layers sharing KV. llama.cpp reuses layer (first_shared - 2) for
      // sliding and (first_shared - 1) for global layers, so the last two owning layers are S then G, as in E2B.
      // 6 layers x PLE width 16 = 96 columns: Q8_0-able, and a small per_layer_token_embd.
      gemma4("tiny-ple",
             {.n_layer = 6, .n_embd = 128, .n_heads = 4, .n_ctx_train = 8192, .sliding_window = 16,
              .n_embd_per_layer = 16},
             {.global_period = 3, .n_kv_heads_sliding = 1, .n_kv_heads_global = 1, .n_ff = 256,
              .double_wide_shared_ff = true, .n_shared_kv_layers = 3}),
      // 31B shrunk: k_eq_v on global layers, different KV head counts on sliding (2) and global (1) layers.
      gemma4("tiny-keqv", {.n_layer = 6, .n_embd = 128, .n_heads = 4, .n_ctx_train = 8192, .sliding_window = 16},
             {.global_period = 3, .n_kv_heads_sliding = 2, .n_kv_heads_global = 1, .n_ff = 512, .k_eq_v = true}),
      // Plain Gemma 4; n_embd 256 so every matrix, token_embd included, can be Q4_K.
      gemma4("tiny-dense", {.n_layer = 4, .n_embd = 256, .n_heads = 4, .n_ctx_train = 8192, .sliding_window = 16},
             {.global_period = 3, .n_kv_heads_sliding = 2, .n_kv_heads_global = 2, .n_ff = 512}),

      // Published Gemma 4 geometries.
      gemma4("e2b",
             {.n_layer = 35, .n_embd = 1536, .n_heads = 8, .n_ctx_train = 131072, .sliding_window = 512,
              .n_embd_per_layer = 256},
             {.global_period = 5, .n_kv_heads_sliding = 1, .n_kv_heads_global = 1, .n_ff = 6144,
              .double_wide_shared_ff = true, .n_shared_kv_layers = 20}),
      gemma4("e4b",
             {.n_layer = 42, .n_embd = 2560, .n_heads = 8, .n_ctx_train = 131072, .sliding_window = 512,
              .n_embd_per_layer = 256},
             {.global_period = 6, .n_kv_heads_sliding = 2, .n_kv_heads_global = 2, .n_ff = 10240,
              .n_shared_kv_layers = 18}),
      gemma4("31b", {.n_layer = 60, .n_embd = 5376, .n_heads = 32, .n_ctx_train = 262144, .sliding_window = 1024},
             {.global_period = 6, .n_kv_heads_sliding = 16, .n_kv_heads_global = 4, .n_ff = 21504, .k_eq_v = true}),
  };
}

}  // namespace

const std::vector<Preset>& all_presets() {
  static const std::vector<Preset> presets = make_presets();
  return presets;
}

std::string preset_names(const std::string& arch_name) {
  std::string names;
  for (const Preset& preset : all_presets()) {
    if (preset.config.arch_name != arch_name) continue;
    if (!names.empty()) names += ", ";
    names += preset.name;
  }
  return names;
}

const Preset& find_preset(const std::string& arch_name, const std::string& name) {
  for (const Preset& preset : all_presets()) {
    if (preset.config.arch_name == arch_name && preset.name == name) return preset;
  }
  throw Error("--preset: no preset '" + name + "' for " + arch_name + " (have: " + preset_names(arch_name) + ")");
}

}  // namespace sparrow::tools::mkmodel
