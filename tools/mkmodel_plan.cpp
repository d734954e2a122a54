#include "mkmodel_plan.h"

#include <algorithm>
#include <cmath>

#include "util/error.h"

namespace sparrow::tools::mkmodel {
namespace {

// ---------------------------------------------------------------------------------------------------------
// Weight types

const std::vector<WeightType>& weight_types() {
  // f32/f16/bf16/q8_0 are the HF converter's --outtype results; the others are llama-quantize --pure results.
  static const std::vector<WeightType> types = {
      {.name = "f32", .type = TensorType::F32, .file_type = 0},
      {.name = "f16", .type = TensorType::F16, .file_type = 1},
      {.name = "bf16", .type = TensorType::BF16, .file_type = 32},
      {.name = "q8_0", .type = TensorType::Q8_0, .file_type = 7},
      {.name = "q4_0", .type = TensorType::Q4_0, .file_type = 2, .via_llama_quantize = true},
      {.name = "q4_1", .type = TensorType::Q4_1, .file_type = 3, .via_llama_quantize = true},
      {.name = "q5_0", .type = TensorType::Q5_0, .file_type = 8, .via_llama_quantize = true},
      {.name = "q5_1", .type = TensorType::Q5_1, .file_type = 9, .via_llama_quantize = true},
      {.name = "q4_k", .type = TensorType::Q4_K, .file_type = 15, .via_llama_quantize = true},
      {.name = "q5_k", .type = TensorType::Q5_K, .file_type = 17, .via_llama_quantize = true},
      {.name = "q6_k", .type = TensorType::Q6_K, .file_type = 18, .via_llama_quantize = true},
  };
  return types;
}

int64_t block_elements(TensorType type) { return tensor_type_info(static_cast<uint32_t>(type))->block_elements; }

// The type a 2-D weight with rows of `row_length` elements gets. Like llama-quantize's tensor_type_fallback: a
// 256-element super-block type falls back to a 32-element type, and F16 when even that does not divide the row
// (the converter also falls back to F16 when Q8_0 cannot be applied).
TensorType matrix_type(TensorType wanted, int64_t row_length) {
  if (row_length % block_elements(wanted) == 0) return wanted;
  TensorType fallback = TensorType::F16;
  switch (wanted) {
    case TensorType::Q4_K: fallback = TensorType::Q5_0; break;
    case TensorType::Q5_K: fallback = TensorType::Q5_1; break;
    case TensorType::Q6_K: fallback = TensorType::Q8_0; break;
    default: break;
  }
  return row_length % block_elements(fallback) == 0 ? fallback : TensorType::F16;
}

// ---------------------------------------------------------------------------------------------------------
// Metadata

// The layers a key speaks for: Gemma 4 has one key for sliding layers and one for global layers.
enum class LayerKind { Any, Sliding, Global };

bool is_kind(const LayerConfig& layer, LayerKind kind) {
  return kind == LayerKind::Any || layer.sliding == (kind == LayerKind::Sliding);
}

// The value `field` has on every layer of `kind`. Throws when layers differ, or when there is no such layer,
// since the file has one key for all of them.
template <class T>
T one_value(const ModelConfig& config, LayerKind kind, T LayerConfig::*field, const std::string& key) {
  const LayerConfig* first = nullptr;
  for (const LayerConfig& layer : config.layers) {
    if (!is_kind(layer, kind)) continue;
    if (first == nullptr) first = &layer;
    if (layer.*field != first->*field) throw Error("mkmodel: " + key + ": layers differ, the key holds one value");
  }
  if (first == nullptr) throw Error("mkmodel: " + key + ": no layer of its kind");
  return first->*field;
}

// Sets "<arch>.<key>" keys from the config.
class MetadataKeys {
 public:
  MetadataKeys(const ModelConfig& config, gguf::Writer& writer)
      : config_(config), writer_(writer), prefix_(config.arch_name + ".") {}

  void u32(const std::string& key, int32_t value) { writer_.set_u32(prefix_ + key, static_cast<uint32_t>(value)); }
  void f32(const std::string& key, float value) { writer_.set_f32(prefix_ + key, value); }
  void u32(const std::string& key, LayerKind kind, int32_t LayerConfig::*field) {
    u32(key, one_value(config_, kind, field, prefix_ + key));
  }
  void f32(const std::string& key, LayerKind kind, float LayerConfig::*field) {
    f32(key, one_value(config_, kind, field, prefix_ + key));
  }
  // One number when every layer has the same, else one per layer, as the converter writes them (gguf-py stores
  // Python int lists as INT32 arrays).
  void per_layer(const std::string& key, int32_t LayerConfig::*field) {
    std::vector<int32_t> values;
    for (const LayerConfig& layer : config_.layers) values.push_back(layer.*field);
    if (std::equal(values.begin() + 1, values.end(), values.begin())) {
      u32(key, values.front());
    } else {
      writer_.set_array_i32(prefix_ + key, values);
    }
  }
  void sliding_pattern(const std::string& key) {
    std::vector<bool> sliding;
    for (const LayerConfig& layer : config_.layers) sliding.push_back(layer.sliding);
    writer_.set_array_bool(prefix_ + key, sliding);
  }

 private:
  const ModelConfig& config_;
  gguf::Writer& writer_;
  std::string prefix_;
};

// llama.cpp fixes what the converter does not write for Gemma 3: a global layer every 6th, RoPE base 1e4 on sliding
// layers, and RoPE over the whole head.
void expect_gemma3_fixed_values(const ModelConfig& config) {
  for (size_t il = 0; il < config.layers.size(); ++il) {
    const LayerConfig& layer = config.layers[il];
    if (layer.sliding != (il % 6 != 5) || (layer.sliding && layer.rope_base != 1e4f) || layer.n_rot != layer.head_dim) {
      throw Error("mkmodel: gemma3 layer " + std::to_string(il) +
                  ": llama.cpp makes every 6th layer global, sliding layers' RoPE base 10000, n_rot the head dim");
    }
  }
}

// The order of Gemma3Model.set_gguf_parameters.
void add_gemma3_metadata(const ModelConfig& config, MetadataKeys& keys) {
  expect_gemma3_fixed_values(config);
  keys.u32("context_length", config.n_ctx_train);
  keys.u32("embedding_length", config.n_embd);
  keys.u32("block_count", config.n_layer);
  keys.per_layer("feed_forward_length", &LayerConfig::n_ff);
  keys.u32("attention.head_count", config.n_heads);
  keys.f32("attention.layer_norm_rms_epsilon", config.rms_eps);
  keys.u32("attention.key_length", LayerKind::Any, &LayerConfig::head_dim);
  keys.u32("attention.value_length", LayerKind::Any, &LayerConfig::head_dim);
  keys.f32("rope.freq_base", LayerKind::Global, &LayerConfig::rope_base);
  keys.u32("attention.sliding_window", config.sliding_window);
  keys.per_layer("attention.head_count_kv", &LayerConfig::n_kv_heads);
  if (config.final_softcap != 0) keys.f32("final_logit_softcapping", config.final_softcap);
}

// The key order of the Hugging Face converter for Gemma 4 (docs/mkmodel.md). KV-shared layers are the last
// attention.shared_kv_layers ones.
void add_gemma4_metadata(const ModelConfig& config, MetadataKeys& keys) {
  const auto n_shared = std::count_if(config.layers.begin(), config.layers.end(),
                                      [](const LayerConfig& layer) { return !layer.owns_kv; });
  keys.u32("block_count", config.n_layer);
  keys.u32("context_length", config.n_ctx_train);
  keys.u32("embedding_length", config.n_embd);
  keys.per_layer("feed_forward_length", &LayerConfig::n_ff);
  keys.u32("attention.head_count", config.n_heads);
  keys.per_layer("attention.head_count_kv", &LayerConfig::n_kv_heads);
  keys.f32("rope.freq_base", LayerKind::Global, &LayerConfig::rope_base);
  keys.f32("rope.freq_base_swa", LayerKind::Sliding, &LayerConfig::rope_base);
  keys.f32("attention.layer_norm_rms_epsilon", config.rms_eps);
  keys.u32("attention.key_length", LayerKind::Global, &LayerConfig::head_dim);
  keys.u32("attention.value_length", LayerKind::Global, &LayerConfig::head_dim);
  keys.f32("final_logit_softcapping", config.final_softcap);
  keys.u32("attention.sliding_window", config.sliding_window);
  keys.u32("attention.shared_kv_layers", static_cast<int32_t>(n_shared));
  keys.u32("embedding_length_per_layer_input", config.n_embd_per_layer);
  keys.sliding_pattern("attention.sliding_window_pattern");
  keys.u32("attention.key_length_swa", LayerKind::Sliding, &LayerConfig::head_dim);
  keys.u32("attention.value_length_swa", LayerKind::Sliding, &LayerConfig::head_dim);
  keys.u32("rope.dimension_count", LayerKind::Global, &LayerConfig::n_rot);
  keys.u32("rope.dimension_count_swa", LayerKind::Sliding, &LayerConfig::n_rot);
}

// ---------------------------------------------------------------------------------------------------------
// Tensors

// Weight scales keep activations near unit size so logits are spread out, not tied:
//  * matrices N(0, 1/sqrt(n_in)); token_embd likewise, so embedding * sqrt(n_embd) has unit entries;
//  * norms near 1 (both converters store the multiplier itself: Gemma 3's +1 is already added);
//  * Gemma 4 has no 1/sqrt(head_dim) attention scale, so its q_norm/k_norm sit near head_dim^-1/4 to give
//    q.k about unit variance instead of a one-hot softmax;
//  * the norms that close a residual branch (post_attention_norm, post_ffw_norm, PLE post_norm) near 2, so
//    the layers outweigh the input embedding in the residual stream: with tied embeddings, a random model whose
//    stream is mostly its input embedding predicts its input token, and greedy decoding repeats one id;
//  * output_norm near 4, so logits have a standard deviation of about 4: greedy picks have clearer margins and
//    Gemma 4's softcap (30) bends the largest logits visibly.
class TensorPlanner {
 public:
  static constexpr float kResidualNorm = 2.0f;

  TensorPlanner(const Preset& preset, const WeightType& weight_type, int64_t n_vocab)
      : config_(preset.config), k_eq_v_(preset.k_eq_v), weight_type_(weight_type), n_vocab_(n_vocab) {}

  std::vector<PlannedTensor> plan() {
    const int64_t E = config_.n_embd;
    matrix("token_embd.weight", {E, n_vocab_});
    if (config_.n_embd_per_layer > 0) {
      const int64_t P = config_.n_embd_per_layer, LP = P * config_.n_layer;
      matrix("per_layer_token_embd.weight", {LP, n_vocab_}, Fill::gaussian(1.0f / std::sqrt(float(P))));
      // llama-quantize never quantizes per_layer_model_proj; the converter (q8_0) does.
      const TensorType proj_type =
          weight_type_.via_llama_quantize ? TensorType::F16 : matrix_type(weight_type_.type, E);
      add("per_layer_model_proj.weight", proj_type, {E, LP}, Fill::gaussian(1.0f / std::sqrt(float(E))));
      norm("per_layer_proj_norm.weight", P);
    }
    if (config_.arch == Architecture::Gemma4) {
      const int32_t n_rot = one_value(config_, LayerKind::Global, &LayerConfig::n_rot, "rope_freqs.weight");
      add("rope_freqs.weight", TensorType::F32, {n_rot / 2}, rope_freqs(n_rot));
    }
    add("output_norm.weight", TensorType::F32, {E}, Fill::uniform(4.0f, 1.0f));
    for (int32_t il = 0; il < config_.n_layer; ++il) layer(il);
    return std::move(tensors_);
  }

 private:
  // Gemma 4 global layers: "proportional" RoPE with partial_rotary_factor 0.25. ggml's NEOX rope rotates dims
  // (i, i + d/2) with frequency base^(-2i/d) / freq_factor[i]; factors of 1e30 freeze all but the first 1/4 of
  // the pairs, as the Hugging Face converter writes them (docs/gemma.md).
  static Fill rope_freqs(int32_t n_rot) {
    const int32_t n_pairs = n_rot / 2;
    const int32_t n_rotated = static_cast<int32_t>(n_rot * 0.25 / 2);
    std::vector<float> factors(size_t(n_pairs), 1e30f);
    std::fill(factors.begin(), factors.begin() + n_rotated, 1.0f);
    return Fill::exact(std::move(factors));
  }

  void layer(int32_t il) {
    const LayerConfig& l = config_.layers[size_t(il)];
    const int64_t E = config_.n_embd, D = l.head_dim, F = l.n_ff;
    const int64_t q_dim = D * config_.n_heads, kv_dim = D * l.n_kv_heads;
    const std::string b = "blk." + std::to_string(il) + ".";
    const bool gemma4 = config_.arch == Architecture::Gemma4;
    const float qk_norm = gemma4 ? 1.0f / std::sqrt(std::sqrt(float(D))) : 1.0f;
    const bool has_v = l.owns_kv && !(k_eq_v_ && !l.sliding);

    norm(b + "attn_norm.weight", E);
    matrix(b + "attn_q.weight", {E, q_dim});
    if (l.owns_kv) matrix(b + "attn_k.weight", {E, kv_dim});
    if (has_v) matrix(b + "attn_v.weight", {E, kv_dim});
    matrix(b + "attn_output.weight", {q_dim, E});
    add(b + "attn_q_norm.weight", TensorType::F32, {D}, Fill::uniform(qk_norm, 0.25f * qk_norm));
    if (l.owns_kv) add(b + "attn_k_norm.weight", TensorType::F32, {D}, Fill::uniform(qk_norm, 0.25f * qk_norm));
    residual_norm(b + "post_attention_norm.weight", E);
    norm(b + "ffn_norm.weight", E);
    matrix(b + "ffn_gate.weight", {E, F});
    matrix(b + "ffn_up.weight", {E, F});
    matrix(b + "ffn_down.weight", {F, E});
    residual_norm(b + "post_ffw_norm.weight", E);
    if (gemma4) {
      if (config_.n_embd_per_layer > 0) {
        const int64_t P = config_.n_embd_per_layer;
        matrix(b + "inp_gate.weight", {E, P});
        matrix(b + "proj.weight", {P, E});
        residual_norm(b + "post_norm.weight", E);
      }
      add(b + "layer_output_scale.weight", TensorType::F32, {1}, Fill::uniform(0.75f, 0.25f));
    }
  }

  void add(std::string name, TensorType type, std::vector<int64_t> ne, Fill fill) {
    tensors_.push_back({std::move(name), type, std::move(ne), std::move(fill)});
  }
  void matrix(std::string name, std::vector<int64_t> ne) {
    const float stddev = 1.0f / std::sqrt(static_cast<float>(ne[0]));
    matrix(std::move(name), std::move(ne), Fill::gaussian(stddev));
  }
  void matrix(std::string name, std::vector<int64_t> ne, Fill fill) {
    const TensorType type = matrix_type(weight_type_.type, ne[0]);
    add(std::move(name), type, std::move(ne), std::move(fill));
  }
  void norm(std::string name, int64_t n) { add(std::move(name), TensorType::F32, {n}, Fill::uniform(1.0f, 0.25f)); }
  void residual_norm(std::string name, int64_t n) {
    add(std::move(name), TensorType::F32, {n}, Fill::uniform(kResidualNorm, 0.25f * kResidualNorm));
  }

  const ModelConfig& config_;
  bool k_eq_v_;
  const WeightType& weight_type_;
  int64_t n_vocab_;
  std::vector<PlannedTensor> tensors_;
};

}  // namespace

const WeightType& find_weight_type(const std::string& name) {
  std::string known;
  for (const WeightType& t : weight_types()) {
    if (t.name == name) return t;
    known += (known.empty() ? "" : ", ") + t.name;
  }
  throw Error("--type: unknown weight type '" + name + "' (have: " + known + ")");
}

void add_architecture_metadata(const ModelConfig& config, gguf::Writer& writer) {
  if (config.n_layer <= 0 || config.layers.size() != size_t(config.n_layer)) {
    throw Error("mkmodel: " + config.arch_name + ": " + std::to_string(config.layers.size()) + " layer configs for " +
                std::to_string(config.n_layer) + " layers");
  }
  MetadataKeys keys(config, writer);
  if (config.arch == Architecture::Gemma3) {
    add_gemma3_metadata(config, keys);
  } else {
    add_gemma4_metadata(config, keys);
  }
}

ModelPlan plan_model(const Preset& preset, const WeightType& weight_type, uint64_t seed, const Vocabulary& vocab) {
  const ModelConfig& config = preset.config;
  ModelPlan plan;
  gguf::Writer& writer = plan.writer;
  writer.set_string("general.architecture", config.arch_name);
  writer.set_string("general.type", "model");
  writer.set_string("general.name", "sparrow-mkmodel " + config.arch_name + " " + preset.name + " " +
                                        weight_type.name + " seed " + std::to_string(seed));
  add_architecture_metadata(config, writer);
  writer.set_u32("general.file_type", weight_type.file_type);
  writer.set_u32("general.quantization_version", 2);
  for (const gguf::Writer::Entry& entry : vocab.keys) writer.set_value(entry.key, entry.value);

  plan.tensors = TensorPlanner(preset, weight_type, static_cast<int64_t>(vocab.n_tokens)).plan();
  for (const PlannedTensor& t : plan.tensors) writer.declare_tensor(t.name, t.type, t.ne);
  return plan;
}

}  // namespace sparrow::tools::mkmodel
