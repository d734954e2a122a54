#include "model/weights.h"

#include <string>

#include "formats/weight_formats.h"
#include "model/key_balance.h"
#include "model/key_transform.h"
#include "util/error.h"

namespace sparrow {
namespace {

// Binds named tensors and places them with the store; on_device says where the next ones go.
class Binder {
 public:
  Binder(const gguf::File& file, WeightStore& store) : file_(file), store_(store) {}
  void place_on_device(bool on_device) { on_device_ = on_device; }

  WeightMatrix matrix(const std::string& name, int64_t n_in, int64_t n_out,
                      WeightUse use = WeightUse::kMatmul) const {
    return store_.place(as_matrix(file_.tensor(name), n_in, n_out), on_device_, use);
  }
  WeightMatrix optional_matrix(const std::string& name, int64_t n_in, int64_t n_out) const {
    const gguf::TensorInfo* t = file_.find_tensor(name);
    return t ? store_.place(as_matrix(*t, n_in, n_out), on_device_, WeightUse::kMatmul) : WeightMatrix{};
  }
  bool has(const std::string& name) const { return file_.find_tensor(name) != nullptr; }
  const float* vector(const std::string& name, int64_t n) const { return place(host_vector(name, n)); }
  std::vector<float> host_vector(const std::string& name, int64_t n) const { return as_vector(file_.tensor(name), n); }
  const float* place(const std::vector<float>& host) const { return store_.place_floats(host.data(), host.size()); }
  // A vector the host reads (scalars such as layer_output_scale); empty when absent.
  std::vector<float> optional_host_vector(const std::string& name, int64_t n) const {
    const gguf::TensorInfo* t = file_.find_tensor(name);
    return t ? as_vector(*t, n) : std::vector<float>{};
  }

 private:
  WeightMatrix as_matrix(const gguf::TensorInfo& t, int64_t n_in, int64_t n_out) const {
    file_.expect_shape(t, {n_in, n_out});
    if (!formats::is_supported_weight_type(t.type))
      throw Error(file_.path() + ": tensor " + t.name + ": weight type " +
                  std::string(tensor_type_info(static_cast<uint32_t>(t.type))->name) + " is not supported");
    return WeightMatrix{t.type, t.data, n_in, n_out};
  }
  std::vector<float> as_vector(const gguf::TensorInfo& t, int64_t n) const {
    file_.expect_shape(t, {n});
    if (!formats::is_supported_weight_type(t.type) || tensor_row_bytes(t.type, n) != t.nbytes)
      throw Error(file_.path() + ": tensor " + t.name + ": unsupported type for a vector");
    std::vector<float> out(n);
    formats::dequantize_row(t.type, t.data, out.data(), n);
    return out;
  }
  const gguf::File& file_;
  WeightStore& store_;
  bool on_device_ = false;
};

std::string blk(int il, const char* name) { return "blk." + std::to_string(il) + "." + name + ".weight"; }

LayerWeights bind_layer(const Binder& b, const ModelConfig& c, int il) {
  const LayerConfig& l = c.layers[il];
  const int64_t q_dim = int64_t(l.head_dim) * c.n_heads;
  const int64_t kv_dim = int64_t(l.head_dim) * l.n_kv_heads;
  LayerWeights w;
  w.attn_norm = b.vector(blk(il, "attn_norm"), c.n_embd);
  w.attn_q = b.matrix(blk(il, "attn_q"), c.n_embd, q_dim);
  if (l.owns_kv) {
    w.attn_k = b.matrix(blk(il, "attn_k"), c.n_embd, kv_dim);
    w.attn_v = c.arch == Architecture::Gemma4 ? b.optional_matrix(blk(il, "attn_v"), c.n_embd, kv_dim)
                                              : b.matrix(blk(il, "attn_v"), c.n_embd, kv_dim);
  }
  w.attn_output = b.matrix(blk(il, "attn_output"), q_dim, c.n_embd);
  w.post_attention_norm = b.vector(blk(il, "post_attention_norm"), c.n_embd);
  w.ffn_norm = b.vector(blk(il, "ffn_norm"), c.n_embd);
  w.ffn_gate = b.matrix(blk(il, "ffn_gate"), c.n_embd, l.n_ff);
  w.ffn_up = b.matrix(blk(il, "ffn_up"), c.n_embd, l.n_ff);
  w.ffn_down = b.matrix(blk(il, "ffn_down"), l.n_ff, c.n_embd);
  w.post_ffw_norm = b.vector(blk(il, "post_ffw_norm"), c.n_embd);
  if (c.n_embd_per_layer > 0) {
    w.ple_inp_gate = b.matrix(blk(il, "inp_gate"), c.n_embd, c.n_embd_per_layer);
    w.ple_proj = b.matrix(blk(il, "proj"), c.n_embd_per_layer, c.n_embd);
    w.ple_post_norm = b.vector(blk(il, "post_norm"), c.n_embd);
  }
  const std::vector<float> scale = b.optional_host_vector(blk(il, "layer_output_scale"), 1);
  if (!scale.empty()) w.output_scale = scale[0];
  return w;
}

// The query and key norm gains of layer il, plain and balanced (key_balance.h), from the balance of the layer
// whose cache it reads (an earlier layer, already in `balance`, for a KV-shared layer).
void bind_qk_norms(const Binder& b, const ModelConfig& c, int il, std::vector<std::vector<float>>& balance,
                   LayerWeights& w) {
  const LayerConfig& l = c.layers[il];
  const std::vector<float> q_gain = b.host_vector(blk(il, "attn_q_norm"), l.head_dim);
  w.attn_q_norm = b.place(q_gain);
  if (l.owns_kv) {
    const std::vector<float> k_gain = b.host_vector(blk(il, "attn_k_norm"), l.head_dim);
    balance[size_t(il)] = key_balance(q_gain, k_gain);
    w.attn_k_norm = b.place(k_gain);
    w.attn_k_norm_balanced = b.place(scaled_gain(k_gain, balance[size_t(il)], false));
  }
  const std::vector<float>& source = balance[size_t(l.kv_source)];
  if (source.size() != q_gain.size())
    throw Error("layer " + std::to_string(il) + " reads the KV cache of layer " + std::to_string(l.kv_source) +
                ", whose head dim differs");
  w.attn_q_norm_balanced = b.place(scaled_gain(q_gain, source, true));
}

}  // namespace

size_t ModelWeights::bytes_read_per_token() const {
  const auto row = [](const WeightMatrix& w) { return w.data ? tensor_row_bytes(w.type, w.n_in) : size_t(0); };
  const auto all = [&](const WeightMatrix& w) { return row(w) * size_t(w.n_out); };
  size_t total = all(output) + row(token_embd) + row(per_layer_token_embd) + all(per_layer_model_proj);
  for (const LayerWeights& l : layers) {
    for (const WeightMatrix* w : {&l.attn_q, &l.attn_k, &l.attn_v, &l.attn_output, &l.ffn_gate, &l.ffn_up,
                                  &l.ffn_down, &l.ple_inp_gate, &l.ple_proj})
      total += all(*w);
  }
  return total;
}

ModelWeights ModelWeights::bind(const gguf::File& file, const ModelConfig& c, WeightStore& store,
                                int32_t n_gpu_layers, const std::function<void(float)>& progress) {
  Binder b(file, store);
  b.place_on_device(n_gpu_layers > c.n_layer);
  ModelWeights w;
  // Without output.weight the embedding is the output head too.
  const bool tied = !b.has("output.weight");
  w.token_embd = b.matrix("token_embd.weight", c.n_embd, c.n_vocab, tied ? WeightUse::kMatmulAndLookup : WeightUse::kLookup);
  w.output = tied ? w.token_embd : b.matrix("output.weight", c.n_embd, c.n_vocab);
  w.output_norm = b.vector("output_norm.weight", c.n_embd);
  for (const LayerConfig& l : c.layers) {
    if (l.proportional_rope && !w.rope_freq_divisors) w.rope_freq_divisors = b.vector("rope_freqs.weight", l.n_rot / 2);
  }
  if (c.n_embd_per_layer > 0) {
    const int64_t ple_width = int64_t(c.n_layer) * c.n_embd_per_layer;
    w.per_layer_token_embd = b.matrix("per_layer_token_embd.weight", ple_width, c.n_vocab, WeightUse::kLookup);
    w.per_layer_model_proj = b.matrix("per_layer_model_proj.weight", c.n_embd, ple_width);
    w.per_layer_proj_norm = b.vector("per_layer_proj_norm.weight", c.n_embd_per_layer);
  }
  std::vector<std::vector<float>> balance(size_t(c.n_layer));  // per layer that owns KV
  for (int il = 0; il < c.n_layer; ++il) {
    b.place_on_device(il < n_gpu_layers);
    w.layers.push_back(bind_layer(b, c, il));
    bind_qk_norms(b, c, il, balance, w.layers.back());
    if (progress) progress(float(il + 1) / c.n_layer);
  }
  return w;
}

void ModelWeights::bind_key_transforms(const gguf::File& file, const ModelConfig& c, WeightStore& store) {
  Binder b(file, store);
  b.place_on_device(true);
  for (int il = 0; il < c.n_layer; ++il) {
    const LayerConfig& l = c.layers[il];
    LayerWeights& w = layers[size_t(il)];
    if (l.owns_kv) {
      w.key_transform = b.matrix(key_transform_tensor(il, false), l.head_dim, l.head_dim);
      w.query_transform = b.matrix(key_transform_tensor(il, true), l.head_dim, l.head_dim);
    } else {
      w.query_transform = layers[size_t(l.kv_source)].query_transform;
    }
    if (w.query_transform.type != TensorType::F32 || (l.owns_kv && w.key_transform.type != TensorType::F32))
      throw Error(file.path() + ": layer " + std::to_string(il) + "'s key transforms must be F32");
  }
}

}  // namespace sparrow
