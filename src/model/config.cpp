#include "model/config.h"

#include <cmath>

#include "util/error.h"

namespace sparrow {
namespace {

// Reads "<arch>.<suffix>" keys and reports errors as "<path>: <key>: <what>".
class Keys {
 public:
  Keys(const gguf::File& file, std::string arch) : file_(file), prefix_(std::move(arch) + ".") {}

  std::string key(const std::string& suffix) const { return prefix_ + suffix; }
  int32_t u32(const std::string& suffix) const { return checked(suffix, file_.get_uint(key(suffix))); }
  int32_t u32_or(const std::string& suffix, int32_t fallback) const {
    auto v = file_.get_uint_opt(key(suffix));
    return v ? checked(suffix, *v) : fallback;
  }
  float f32_or(const std::string& suffix, float fallback) const {
    auto v = file_.get_float_opt(key(suffix));
    return v ? static_cast<float>(*v) : fallback;
  }
  bool has(const std::string& suffix) const { return file_.has(key(suffix)); }

  // A key that is either one integer for every layer or an array with one entry per layer.
  std::vector<int32_t> per_layer(const std::string& suffix, int32_t n_layer) const {
    const gguf::Value* v = file_.find(key(suffix));
    if (!v) fail(suffix, "missing");
    if (v->type != gguf::ValueType::ARRAY) return std::vector<int32_t>(n_layer, u32(suffix));
    std::vector<int64_t> values = file_.get_int_array(key(suffix));
    if (static_cast<int32_t>(values.size()) != n_layer)
      fail(suffix, "has " + std::to_string(values.size()) + " entries, expected " + std::to_string(n_layer) +
                       " (block_count)");
    std::vector<int32_t> out;
    for (int64_t x : values) out.push_back(checked(suffix, static_cast<uint64_t>(x < 0 ? 0 : x)));
    return out;
  }

  [[noreturn]] void fail(const std::string& suffix, const std::string& what) const {
    throw Error(file_.path() + ": " + key(suffix) + ": " + what);
  }

 private:
  int32_t checked(const std::string& suffix, uint64_t v) const {
    if (v == 0 || v > (1u << 30)) fail(suffix, "value " + std::to_string(v) + " is out of range");
    return static_cast<int32_t>(v);
  }
  const gguf::File& file_;
  std::string prefix_;
};

// Gemma 3 marks sliding layers by a period (llama.cpp's default 6: layer il slides iff il % 6 < 5).
std::vector<bool> gemma3_sliding_layers(const gguf::File& file, const Keys& keys, int32_t n_layer) {
  std::vector<bool> sliding(n_layer, false);
  if (keys.u32_or("attention.sliding_window", 0) == 0) return sliding;
  if (file.find(keys.key("attention.sliding_window_pattern")) &&
      file.find(keys.key("attention.sliding_window_pattern"))->type == gguf::ValueType::ARRAY) {
    std::vector<bool> pattern = file.get_bool_array(keys.key("attention.sliding_window_pattern"));
    if (int64_t(pattern.size()) != n_layer)
      keys.fail("attention.sliding_window_pattern", std::to_string(pattern.size()) + " entries for " +
                                                        std::to_string(n_layer) + " layers");
    return pattern;
  }
  const int64_t period = keys.u32_or("attention.sliding_window_pattern", 6);
  if (period < 1) keys.fail("attention.sliding_window_pattern", "a period of 0 layers");
  for (int32_t il = 0; il < n_layer; ++il) sliding[il] = il % period < period - 1;
  return sliding;
}

void read_common(const gguf::File& file, const Keys& keys, ModelConfig& c) {
  c.n_layer = keys.u32("block_count");
  if (c.n_layer > 4096) keys.fail("block_count", "value " + std::to_string(c.n_layer) + " is out of range");
  c.n_embd = keys.u32("embedding_length");
  c.n_heads = keys.u32("attention.head_count");
  c.n_ctx_train = keys.u32_or("context_length", 8192);
  c.rms_eps = keys.f32_or("attention.layer_norm_rms_epsilon", 1e-6f);
  c.final_softcap = keys.f32_or("final_logit_softcapping", 0.0f);
  c.sliding_window = keys.u32_or("attention.sliding_window", 0);
  c.layers.resize(c.n_layer);
  std::vector<int32_t> n_ff = keys.per_layer("feed_forward_length", c.n_layer);
  std::vector<int32_t> n_kv = keys.per_layer("attention.head_count_kv", c.n_layer);
  for (int32_t il = 0; il < c.n_layer; ++il) {
    LayerConfig& l = c.layers[il];
    l.n_ff = n_ff[il];
    l.n_kv_heads = n_kv[il];
    l.kv_source = il;
    if (c.n_heads % l.n_kv_heads != 0)
      keys.fail("attention.head_count_kv", "layer " + std::to_string(il) + " has " +
                                               std::to_string(l.n_kv_heads) + " KV heads, which do not divide " +
                                               std::to_string(c.n_heads) + " query heads");
  }
}

void read_gemma3(const gguf::File& file, const Keys& keys, ModelConfig& c) {
  int32_t head_dim = keys.u32_or("attention.key_length", c.n_embd / c.n_heads);
  std::vector<bool> sliding = gemma3_sliding_layers(file, keys, c.n_layer);
  float global_base = keys.f32_or("rope.freq_base", 1e6f);
  float sliding_base = keys.f32_or("rope.freq_base_swa", 10000.0f);
  float global_scale = 1.0f;
  auto scaling_type = file.get_string_opt(keys.key("rope.scaling.type"));
  if (scaling_type && *scaling_type == "linear") global_scale = 1.0f / keys.f32_or("rope.scaling.factor", 1.0f);
  int32_t n_rot = keys.u32_or("rope.dimension_count", head_dim);
  for (int32_t il = 0; il < c.n_layer; ++il) {
    LayerConfig& l = c.layers[il];
    l.sliding = sliding[il];
    l.head_dim = head_dim;
    l.n_rot = n_rot;
    l.rope_base = l.sliding ? sliding_base : global_base;
    l.rope_scale = l.sliding ? 1.0f : global_scale;
  }
  // gemma_pytorch: query_pre_attn_scalar is n_embd / n_heads for the 27B (62 layers), head_dim otherwise.
  c.attention_scale = 1.0f / std::sqrt(static_cast<float>(c.n_layer == 62 ? c.n_embd / c.n_heads : head_dim));
}

void read_gemma4(const gguf::File& file, const Keys& keys, ModelConfig& c) {
  if (keys.u32_or("expert_count", 0) > 0)
    keys.fail("expert_count", "Gemma 4 mixture-of-experts models (26B-A4B) are not supported yet");
  const std::string pattern_key = keys.key("attention.sliding_window_pattern");
  std::vector<bool> sliding = file.get_bool_array(pattern_key);
  if (static_cast<int32_t>(sliding.size()) != c.n_layer)
    keys.fail("attention.sliding_window_pattern", "has " + std::to_string(sliding.size()) +
                                                      " entries, expected " + std::to_string(c.n_layer));
  int32_t global_dim = keys.u32("attention.key_length");
  int32_t sliding_dim = keys.u32("attention.key_length_swa");
  if (keys.u32_or("attention.value_length", global_dim) != global_dim ||
      keys.u32_or("attention.value_length_swa", sliding_dim) != sliding_dim)
    keys.fail("attention.value_length", "Gemma 4 needs equal K and V head dims");
  int32_t n_shared = static_cast<int32_t>(file.get_uint_opt(keys.key("attention.shared_kv_layers")).value_or(0));
  if (n_shared >= c.n_layer) keys.fail("attention.shared_kv_layers", "must be below block_count");
  int32_t first_shared = c.n_layer - n_shared;
  float global_base = keys.f32_or("rope.freq_base", 1e6f);
  float sliding_base = keys.f32_or("rope.freq_base_swa", 10000.0f);
  int32_t global_rot = keys.u32_or("rope.dimension_count", global_dim);
  int32_t sliding_rot = keys.u32_or("rope.dimension_count_swa", sliding_dim);
  for (int32_t il = 0; il < c.n_layer; ++il) {
    LayerConfig& l = c.layers[il];
    l.sliding = sliding[il];
    l.head_dim = l.sliding ? sliding_dim : global_dim;
    l.n_rot = l.sliding ? sliding_rot : global_rot;
    l.rope_base = l.sliding ? sliding_base : global_base;
    l.proportional_rope = !l.sliding;
    if (il >= first_shared) {
      // HF: a shared layer reads the last non-shared layer of the same attention type.
      l.owns_kv = false;
      l.kv_source = -1;
      for (int32_t src = first_shared - 1; src >= 0; --src)
        if (sliding[src] == l.sliding) { l.kv_source = src; break; }
      if (l.kv_source < 0)
        keys.fail("attention.shared_kv_layers", "layer " + std::to_string(il) +
                                                    " has no earlier layer of its type to share KV with");
      l.n_kv_heads = c.layers[l.kv_source].n_kv_heads;
    }
  }
  c.n_embd_per_layer = static_cast<int32_t>(file.get_uint_opt(keys.key("embedding_length_per_layer_input")).value_or(0));
  c.attention_scale = 1.0f;
  c.normalize_v = true;
}

}  // namespace

ModelConfig ModelConfig::from_gguf(const gguf::File& file) {
  ModelConfig c;
  c.arch_name = file.get_string("general.architecture");
  if (c.arch_name == "gemma3") c.arch = Architecture::Gemma3;
  else if (c.arch_name == "gemma4") c.arch = Architecture::Gemma4;
  else throw Error(file.path() + ": general.architecture: '" + c.arch_name +
                   "' is not supported (Sparrow runs gemma3 and gemma4)");
  Keys keys(file, c.arch_name);
  read_common(file, keys, c);
  if (c.arch == Architecture::Gemma3) read_gemma3(file, keys, c);
  else read_gemma4(file, keys, c);
  for (int32_t il = 0; il < c.n_layer; ++il) {
    const LayerConfig& l = c.layers[il];
    if (l.head_dim % 2 != 0 || l.head_dim > 1024 || l.n_rot > l.head_dim || l.n_rot % 2 != 0)
      keys.fail("attention.key_length", "layer " + std::to_string(il) + ": head dim " +
                                            std::to_string(l.head_dim) + " / rotary dims " +
                                            std::to_string(l.n_rot) + " are not usable");
  }
  if (c.sliding_window <= 0)
    for (auto& l : c.layers) l.sliding = false;
  const gguf::TensorInfo& embd = file.tensor("token_embd.weight");
  c.n_vocab = static_cast<int32_t>(embd.ne[1]);
  return c;
}

}  // namespace sparrow
