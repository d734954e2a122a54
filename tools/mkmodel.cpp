// `sparrow mkmodel`: writes a Gemma 3 / Gemma 4 GGUF with deterministic random weights in llama.cpp's exact
// layout (tensor names, shapes, types, metadata keys of convert_hf_to_gguf.py + llama-quantize), with a real
// 262144-token vocabulary copied from another GGUF. Tests and benchmarks use these files to compare Sparrow with
// llama.cpp on every mechanism of the architectures without downloading gigabytes of real weights.
// Geometry: mkmodel_presets.h. Streaming GGUF output: mkmodel_stream.h. User guide: docs/mkmodel.md.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "commands.h"
#include "formats/weight_formats.h"
#include "gguf/gguf.h"
#include "mkmodel_presets.h"
#include "mkmodel_stream.h"
#include "runtime/resources.h"
#include "util/error.h"

namespace sparrow::tools {
namespace mkmodel {
namespace {

// ---------------------------------------------------------------------------------------------------------
// Weight types

struct WeightType {
  std::string name;        // as given to --type
  TensorType type;         // what 2-D weights become when their rows allow it
  uint32_t file_type;      // llama_ftype written to general.file_type
  bool via_llama_quantize; // only llama-quantize makes it (not the HF converter): see per_layer_model_proj
};

const std::vector<WeightType>& weight_types() {
  // f32/f16/bf16/q8_0 are convert_hf_to_gguf.py --outtype results; the others are llama-quantize --pure results.
  static const std::vector<WeightType> types = {
      {"f32", TensorType::F32, 0, false},   {"f16", TensorType::F16, 1, false},
      {"bf16", TensorType::BF16, 32, false}, {"q8_0", TensorType::Q8_0, 7, false},
      {"q4_0", TensorType::Q4_0, 2, true},  {"q4_1", TensorType::Q4_1, 3, true},
      {"q5_0", TensorType::Q5_0, 8, true},  {"q5_1", TensorType::Q5_1, 9, true},
      {"q4_k", TensorType::Q4_K, 15, true}, {"q5_k", TensorType::Q5_K, 17, true},
      {"q6_k", TensorType::Q6_K, 18, true},
  };
  return types;
}

const WeightType& find_weight_type(const std::string& name) {
  std::string known;
  for (const WeightType& t : weight_types()) {
    if (t.name == name) return t;
    known += (known.empty() ? "" : ", ") + t.name;
  }
  throw Error("--type: unknown weight type '" + name + "' (have: " + known + ")");
}

int64_t block_elements(TensorType type) {
  return tensor_type_info(static_cast<uint32_t>(type))->block_elements;
}

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
// Deterministic random values: a counter-based generator (splitmix64's mixer over seed, tensor name and element
// index), so every element is reproducible on its own and threads can fill any rows in any order.

uint64_t mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

uint64_t fnv1a(const std::string& s) {
  uint64_t h = 0xCBF29CE484222325ull;
  for (unsigned char c : s) h = (h ^ c) * 0x100000001B3ull;
  return h;
}

struct Fill {
  enum class Kind { Gaussian, Uniform, Values };
  Kind kind = Kind::Gaussian;
  float center = 0;  // mean
  float spread = 0;  // Gaussian: standard deviation; Uniform: half width
  std::vector<float> values;  // Kind::Values: the exact contents

  static Fill gaussian(float stddev) { return {Kind::Gaussian, 0, stddev, {}}; }
  static Fill uniform(float center, float half_width) { return {Kind::Uniform, center, half_width, {}}; }
  static Fill exact(std::vector<float> v) { return {Kind::Values, 0, 0, std::move(v)}; }
};

class RandomStream {
 public:
  RandomStream(uint64_t seed, const std::string& tensor_name) : key_(mix64(mix64(seed) ^ fnv1a(tensor_name))) {}

  float value(const Fill& fill, uint64_t index) const {
    const uint64_t bits = mix64(key_ + (index + 1) * 0x9E3779B97F4A7C15ull);
    if (fill.kind == Fill::Kind::Uniform) {
      const float u = static_cast<float>(bits >> 40) * (1.0f / 16777216.0f);  // [0, 1), 24 bits
      return fill.center + fill.spread * (2.0f * u - 1.0f);
    }
    // Sum of four 16-bit uniforms (Irwin-Hall): bell-shaped, unit variance after scaling, tails cut at 3.5
    // sigma. One 64-bit draw per element, several times cheaper than Box-Muller for billions of weights.
    const double sum = static_cast<double>((bits & 0xFFFF) + ((bits >> 16) & 0xFFFF) + ((bits >> 32) & 0xFFFF) +
                                           (bits >> 48));
    constexpr double kMean = 4 * 65535 / 2.0;
    const double kStddev = std::sqrt((65536.0 * 65536.0 - 1) / 3.0);
    return fill.center + fill.spread * static_cast<float>((sum - kMean) / kStddev);
  }

 private:
  uint64_t key_;
};

// ---------------------------------------------------------------------------------------------------------
// The model plan: metadata and tensors, exactly as llama.cpp's loader expects them.

struct PlannedTensor {
  std::string name;
  TensorType type;
  std::vector<int64_t> ne;
  Fill fill;
};

struct Plan {
  std::vector<std::pair<std::string, gguf::Value>> metadata;
  std::vector<PlannedTensor> tensors;
};

gguf::Value value_u32(uint32_t v) {
  gguf::Value out;
  out.type = gguf::ValueType::UINT32;
  out.u = v;
  return out;
}

gguf::Value value_f32(float v) {
  gguf::Value out;
  out.type = gguf::ValueType::FLOAT32;
  out.f = v;
  return out;
}

gguf::Value value_string(std::string v) {
  gguf::Value out;
  out.type = gguf::ValueType::STRING;
  out.s = std::move(v);
  return out;
}

// gguf-py writes Python int lists as INT32 arrays.
gguf::Value value_i32_array(const std::vector<uint32_t>& v) {
  gguf::Value out;
  out.type = gguf::ValueType::ARRAY;
  out.element_type = gguf::ValueType::INT32;
  out.array_i.assign(v.begin(), v.end());
  return out;
}

gguf::Value value_bool_array(const std::vector<bool>& v) {
  gguf::Value out;
  out.type = gguf::ValueType::ARRAY;
  out.element_type = gguf::ValueType::BOOL;
  out.array_u.assign(v.begin(), v.end());
  return out;
}

struct Vocabulary {
  uint64_t n_tokens = 0;
  std::vector<std::pair<std::string, gguf::Value>> keys;  // every tokenizer.* key of the source file
};

Vocabulary read_vocabulary(const std::string& path) {
  const std::unique_ptr<gguf::File> file = gguf::File::open(path);
  Vocabulary vocab;
  vocab.n_tokens = file->get_string_array("tokenizer.ggml.tokens").size();
  if (vocab.n_tokens == 0) throw Error(path + ": tokenizer.ggml.tokens: empty, --vocab needs a tokenizer");
  for (const auto& [key, value] : file->metadata()) {
    if (key.rfind("tokenizer.", 0) == 0) vocab.keys.emplace_back(key, value);
  }
  return vocab;
}

std::string default_vocab_path(Arch arch) {
  const std::filesystem::path path =
      arch == Arch::Gemma4 ? resources::gemma4_vocab_path() : resources::default_model().path;
  if (path.empty())
    throw Error(std::string("no --vocab given and the default (") +
                (arch == Arch::Gemma4 ? "shared/fixtures/ggml-vocab-gemma-4.gguf; set SPARROW_SHARED"
                                      : "the Gemma 3 270M model; set SPARROW_MODEL") +
                ") was not found");
  return path.string();
}

// Keys in the order convert_hf_to_gguf.py writes them (Gemma3Model / Gemma4Model.set_gguf_parameters).
void add_gemma3_metadata(const Geometry& g, Plan& plan) {
  auto key = [&](const std::string& name, gguf::Value v) { plan.metadata.emplace_back("gemma3." + name, v); };
  key("context_length", value_u32(g.context_length));
  key("embedding_length", value_u32(g.n_embd));
  key("block_count", value_u32(g.n_layer));
  key("feed_forward_length", value_u32(g.n_ff[0]));
  key("attention.head_count", value_u32(g.n_head));
  key("attention.layer_norm_rms_epsilon", value_f32(g.rms_eps));
  key("attention.key_length", value_u32(g.head_dim_full));
  key("attention.value_length", value_u32(g.head_dim_full));
  key("rope.freq_base", value_f32(g.rope_freq_base));
  key("attention.sliding_window", value_u32(g.sliding_window));
  key("attention.head_count_kv", value_u32(g.n_head_kv_full));
}

void add_gemma4_metadata(const Geometry& g, Plan& plan) {
  auto key = [&](const std::string& name, gguf::Value v) { plan.metadata.emplace_back("gemma4." + name, v); };
  key("block_count", value_u32(g.n_layer));
  key("context_length", value_u32(g.context_length));
  key("embedding_length", value_u32(g.n_embd));
  key("feed_forward_length", g.n_ff_is_array() ? value_i32_array(g.n_ff) : value_u32(g.n_ff[0]));
  key("attention.head_count", value_u32(g.n_head));
  if (g.n_head_kv_is_array()) {
    std::vector<uint32_t> kv(g.n_layer);
    for (uint32_t il = 0; il < g.n_layer; ++il) kv[il] = g.n_head_kv(il);
    key("attention.head_count_kv", value_i32_array(kv));
  } else {
    key("attention.head_count_kv", value_u32(g.n_head_kv_full));
  }
  key("rope.freq_base", value_f32(g.rope_freq_base));
  key("rope.freq_base_swa", value_f32(g.rope_freq_base_swa));
  key("attention.layer_norm_rms_epsilon", value_f32(g.rms_eps));
  key("attention.key_length", value_u32(g.head_dim_full));
  key("attention.value_length", value_u32(g.head_dim_full));
  key("final_logit_softcapping", value_f32(g.final_logit_softcapping));
  key("attention.sliding_window", value_u32(g.sliding_window));
  key("attention.shared_kv_layers", value_u32(g.shared_kv_layers));
  key("embedding_length_per_layer_input", value_u32(g.per_layer_input_dim));
  key("attention.sliding_window_pattern", value_bool_array(g.is_swa));
  key("attention.key_length_swa", value_u32(g.head_dim_swa));
  key("attention.value_length_swa", value_u32(g.head_dim_swa));
  key("rope.dimension_count", value_u32(g.head_dim_full));  // n_rot = full head dim, "proportional" via rope_freqs
  key("rope.dimension_count_swa", value_u32(g.head_dim_swa));
}

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
class PlanBuilder {
 public:
  static constexpr float kResidualNorm = 2.0f;


  PlanBuilder(const Geometry& g, const WeightType& wt, uint64_t n_vocab) : g_(g), wt_(wt), n_vocab_(n_vocab) {}

  std::vector<PlannedTensor> build() {
    const int64_t E = g_.n_embd;
    const int64_t V = static_cast<int64_t>(n_vocab_);
    matrix("token_embd.weight", {E, V});
    if (g_.per_layer_input_dim > 0) {
      const int64_t P = g_.per_layer_input_dim, LP = P * g_.n_layer;
      matrix("per_layer_token_embd.weight", {LP, V}, Fill::gaussian(1.0f / std::sqrt(float(P))));
      // llama-quantize never quantizes per_layer_model_proj; the converter (q8_0) does.
      const TensorType proj_type = wt_.via_llama_quantize ? TensorType::F16 : matrix_type(wt_.type, E);
      add("per_layer_model_proj.weight", proj_type, {E, LP}, Fill::gaussian(1.0f / std::sqrt(float(E))));
      norm("per_layer_proj_norm.weight", P);
    }
    if (g_.arch == Arch::Gemma4) add("rope_freqs.weight", TensorType::F32, {g_.head_dim_full / 2}, rope_freqs());
    add("output_norm.weight", TensorType::F32, {E}, Fill::uniform(4.0f, 1.0f));
    for (uint32_t il = 0; il < g_.n_layer; ++il) layer(il);
    return std::move(tensors_);
  }

 private:
  // Gemma 4 global layers: "proportional" RoPE with partial_rotary_factor 0.25. ggml's NEOX rope rotates dims
  // (i, i + d/2) with frequency base^(-2i/d) / freq_factor[i]; factors of 1e30 freeze all but the first 1/4 of
  // the pairs (convert_hf_to_gguf.py Gemma4Model.generate_extra_tensors).
  Fill rope_freqs() const {
    const uint32_t n_pairs = g_.head_dim_full / 2;
    const uint32_t n_rotated = static_cast<uint32_t>(g_.head_dim_full * 0.25 / 2);
    std::vector<float> factors(n_pairs, 1e30f);
    std::fill(factors.begin(), factors.begin() + n_rotated, 1.0f);
    return Fill::exact(std::move(factors));
  }

  void layer(uint32_t il) {
    const int64_t E = g_.n_embd, D = g_.head_dim(il), F = g_.n_ff[il];
    const int64_t q_dim = D * g_.n_head, kv_dim = D * g_.n_head_kv(il);
    const std::string b = "blk." + std::to_string(il) + ".";
    const bool gemma4 = g_.arch == Arch::Gemma4;
    const float qk_norm = gemma4 ? 1.0f / std::sqrt(std::sqrt(float(D))) : 1.0f;

    norm(b + "attn_norm.weight", E);
    matrix(b + "attn_q.weight", {E, q_dim});
    if (g_.has_kv(il)) matrix(b + "attn_k.weight", {E, kv_dim});
    if (g_.has_attn_v(il)) matrix(b + "attn_v.weight", {E, kv_dim});
    matrix(b + "attn_output.weight", {q_dim, E});
    add(b + "attn_q_norm.weight", TensorType::F32, {D}, Fill::uniform(qk_norm, 0.25f * qk_norm));
    if (g_.has_kv(il)) add(b + "attn_k_norm.weight", TensorType::F32, {D}, Fill::uniform(qk_norm, 0.25f * qk_norm));
    residual_norm(b + "post_attention_norm.weight", E);
    norm(b + "ffn_norm.weight", E);
    matrix(b + "ffn_gate.weight", {E, F});
    matrix(b + "ffn_up.weight", {E, F});
    matrix(b + "ffn_down.weight", {F, E});
    residual_norm(b + "post_ffw_norm.weight", E);
    if (gemma4) {
      if (g_.per_layer_input_dim > 0) {
        const int64_t P = g_.per_layer_input_dim;
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
    const TensorType type = matrix_type(wt_.type, ne[0]);
    add(std::move(name), type, std::move(ne), std::move(fill));
  }
  void norm(std::string name, int64_t n) { add(std::move(name), TensorType::F32, {n}, Fill::uniform(1.0f, 0.25f)); }
  void residual_norm(std::string name, int64_t n) {
    add(std::move(name), TensorType::F32, {n}, Fill::uniform(kResidualNorm, 0.25f * kResidualNorm));
  }

  const Geometry& g_;
  const WeightType& wt_;
  uint64_t n_vocab_;
  std::vector<PlannedTensor> tensors_;
};

Plan make_plan(const Geometry& g, const WeightType& wt, uint64_t seed, const Vocabulary& vocab) {
  Plan plan;
  plan.metadata.emplace_back("general.architecture", value_string(arch_name(g.arch)));
  plan.metadata.emplace_back("general.type", value_string("model"));
  plan.metadata.emplace_back("general.name", value_string(std::string("sparrow-mkmodel ") + arch_name(g.arch) + " " +
                                                          g.preset + " " + wt.name + " seed " + std::to_string(seed)));
  if (g.arch == Arch::Gemma3) {
    add_gemma3_metadata(g, plan);
  } else {
    add_gemma4_metadata(g, plan);
  }
  plan.metadata.emplace_back("general.file_type", value_u32(wt.file_type));
  plan.metadata.emplace_back("general.quantization_version", value_u32(2));
  for (const auto& kv : vocab.keys) plan.metadata.push_back(kv);
  plan.tensors = PlanBuilder(g, wt, vocab.n_tokens).build();
  return plan;
}

// ---------------------------------------------------------------------------------------------------------
// Producing tensor bytes

// Fills rows [first, first + n) of a tensor into `out` (row_bytes each), one row of floats at a time.
void produce_rows(const PlannedTensor& t, const RandomStream& rng, int64_t first, int64_t n, uint8_t* out) {
  const int64_t row_length = t.ne[0];
  const size_t row_bytes = tensor_row_bytes(t.type, row_length);
  std::vector<float> row(static_cast<size_t>(row_length));
  for (int64_t r = first; r < first + n; ++r) {
    const uint64_t base = static_cast<uint64_t>(r) * static_cast<uint64_t>(row_length);
    for (int64_t i = 0; i < row_length; ++i) row[size_t(i)] = rng.value(t.fill, base + uint64_t(i));
    formats::quantize_row(t.type, row.data(), out + size_t(r - first) * row_bytes, row_length);
  }
}

void produce_tensor(const PlannedTensor& t, const TensorDecl& decl, uint64_t seed, unsigned n_threads,
                    const ByteSink& sink) {
  if (t.fill.kind == Fill::Kind::Values) {
    if (t.type != TensorType::F32 || int64_t(t.fill.values.size()) != decl.row_length() * decl.n_rows()) {
      throw Error("tensor " + t.name + ": exact values must be f32 and cover the tensor");
    }
    return sink(t.fill.values.data(), t.fill.values.size() * sizeof(float));
  }
  // Chunks of about 16M elements bound memory (a 31B token_embd is 1.4G elements); threads split each chunk.
  constexpr int64_t kChunkElements = int64_t(1) << 24;
  const RandomStream rng(seed, t.name);
  const int64_t n_rows = decl.n_rows(), row_length = decl.row_length();
  const size_t row_bytes = tensor_row_bytes(t.type, row_length);
  const int64_t rows_per_chunk = std::max<int64_t>(1, kChunkElements / row_length);
  std::vector<uint8_t> chunk(size_t(std::min(rows_per_chunk, n_rows)) * row_bytes);
  for (int64_t first = 0; first < n_rows; first += rows_per_chunk) {
    const int64_t rows = std::min(rows_per_chunk, n_rows - first);
    const int64_t workers = std::min<int64_t>(n_threads, std::max<int64_t>(1, rows * row_length / 65536));
    if (workers <= 1) {
      produce_rows(t, rng, first, rows, chunk.data());
    } else {
      std::vector<std::thread> threads;
      std::vector<std::exception_ptr> errors(static_cast<size_t>(workers));
      const int64_t per_worker = (rows + workers - 1) / workers;
      for (int64_t w = 0; w < workers; ++w) {
        const int64_t begin = w * per_worker, count = std::min(per_worker, rows - begin);
        if (count <= 0) break;
        threads.emplace_back([&, w, begin, count] {
          try {
            produce_rows(t, rng, first + begin, count, chunk.data() + size_t(begin) * row_bytes);
          } catch (...) {
            errors[size_t(w)] = std::current_exception();
          }
        });
      }
      for (std::thread& th : threads) th.join();
      for (const std::exception_ptr& e : errors) {
        if (e) std::rethrow_exception(e);
      }
    }
    sink(chunk.data(), size_t(rows) * row_bytes);
  }
}

// ---------------------------------------------------------------------------------------------------------
// The command

struct Options {
  std::string arch;
  std::string preset;
  std::string type = "f16";
  uint64_t seed = 1;
  std::string vocab;
  std::string output;
  unsigned threads = 0;
  bool dry_run = false;
  bool verbose = false;
};

std::string shape_text(const std::vector<int64_t>& ne) {
  std::string s = "{";
  for (size_t i = 0; i < ne.size(); ++i) s += (i ? ", " : "") + std::to_string(ne[i]);
  return s + "}";
}

std::string value_text(const gguf::Value& v) {
  using VT = gguf::ValueType;
  switch (v.type) {
    case VT::STRING: return "\"" + v.s + "\"";
    case VT::FLOAT32: case VT::FLOAT64: {
      char buf[32];
      std::snprintf(buf, sizeof buf, "%g", v.f);
      return buf;
    }
    case VT::BOOL: return v.u ? "true" : "false";
    case VT::INT8: case VT::INT16: case VT::INT32: case VT::INT64: return std::to_string(v.i);
    case VT::ARRAY: {
      const size_t n = v.array_size();
      if (n > 64) return "[" + std::to_string(n) + " elements]";
      std::string s = "[";
      for (size_t i = 0; i < n; ++i) {
        s += i ? ", " : "";
        if (!v.array_i.empty()) s += std::to_string(v.array_i[i]);
        else if (!v.array_u.empty()) s += v.element_type == VT::BOOL ? (v.array_u[i] ? "true" : "false")
                                                                      : std::to_string(v.array_u[i]);
        else if (!v.array_f.empty()) s += std::to_string(v.array_f[i]);
        else s += "\"" + v.array_s[i] + "\"";
      }
      return s + "]";
    }
    default: return std::to_string(v.u);
  }
}

// --dry-run: the header as it would be written, one line per key and per tensor, for checking big presets.
void print_plan(const Plan& plan, const StreamingGgufWriter& writer) {
  for (const auto& [key, value] : plan.metadata) {
    if (key.rfind("tokenizer.", 0) == 0 && value.type == gguf::ValueType::ARRAY) {
      std::printf("kv %s = [%zu elements]\n", key.c_str(), value.array_size());
    } else if (key.rfind("tokenizer.", 0) == 0 && value.type == gguf::ValueType::STRING && value.s.size() > 64) {
      std::printf("kv %s = [%zu bytes]\n", key.c_str(), value.s.size());
    } else {
      std::printf("kv %s = %s\n", key.c_str(), value_text(value).c_str());
    }
  }
  for (const TensorDecl& t : writer.tensors()) {
    std::printf("tensor %s %s %s %llu\n", t.name.c_str(), tensor_type_name(t.type).c_str(), shape_text(t.ne).c_str(),
                static_cast<unsigned long long>(t.nbytes));
  }
  std::printf("data bytes %llu\n", static_cast<unsigned long long>(writer.data_size()));
}

void run(const Options& options) {
  const Arch arch = options.arch == "gemma3" ? Arch::Gemma3 : Arch::Gemma4;
  const Geometry geometry = find_preset(arch, options.preset);
  const WeightType& weight_type = find_weight_type(options.type);
  const std::string vocab_path = options.vocab.empty() ? default_vocab_path(arch) : options.vocab;
  const Vocabulary vocab = read_vocabulary(vocab_path);
  const Plan plan = make_plan(geometry, weight_type, options.seed, vocab);

  StreamingGgufWriter writer;
  for (const auto& [key, value] : plan.metadata) writer.add_metadata(key, value);
  for (const PlannedTensor& t : plan.tensors) writer.add_tensor(t.name, t.type, t.ne);
  if (options.dry_run) return print_plan(plan, writer);
  if (options.output.empty()) throw Error("-o/--output is required (or --dry-run)");

  const unsigned n_threads = options.threads > 0 ? options.threads : std::max(1u, std::thread::hardware_concurrency());
  const auto start = std::chrono::steady_clock::now();
  size_t index = 0;
  writer.write(options.output, [&](const TensorDecl& decl, const ByteSink& sink) {
    const PlannedTensor& t = plan.tensors[index++];
    if (options.verbose) {
      std::fprintf(stderr, "mkmodel: %s %s %s\n", t.name.c_str(), tensor_type_name(t.type).c_str(),
                   shape_text(t.ne).c_str());
    }
    produce_tensor(t, decl, options.seed, n_threads, sink);
  });
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf("wrote %s: %s %s %s, %zu tensors, %.1f MiB, vocab %llu from %s, %.1f s\n", options.output.c_str(),
              arch_name(arch), geometry.preset.c_str(), weight_type.name.c_str(), plan.tensors.size(),
              double(writer.data_size()) / (1 << 20), static_cast<unsigned long long>(vocab.n_tokens),
              vocab_path.c_str(), seconds);
}

}  // namespace
}  // namespace mkmodel

void add_mkmodel_command(CLI::App& app, int& exit_code) {
  auto options = std::make_shared<mkmodel::Options>();
  CLI::App* cmd = app.add_subcommand(
      "mkmodel", "Write a Gemma 3/4 GGUF with deterministic random weights in llama.cpp's layout (docs/mkmodel.md)");
  cmd->add_option("--arch", options->arch, "gemma3 or gemma4")->required()->check(CLI::IsMember({"gemma3", "gemma4"}));
  cmd->add_option("--preset", options->preset,
                  "gemma3: " + mkmodel::preset_names(mkmodel::Arch::Gemma3) +
                      "; gemma4: " + mkmodel::preset_names(mkmodel::Arch::Gemma4))
      ->required();
  cmd->add_option("--type", options->type,
                  "weight type of 2-D tensors: f32 f16 bf16 q8_0 q4_0 q4_1 q5_0 q5_1 q4_k q5_k q6_k (default f16)");
  cmd->add_option("--seed", options->seed, "random seed (default 1)");
  cmd->add_option("--vocab", options->vocab, "GGUF whose tokenizer.* keys are copied (default: per architecture)");
  cmd->add_option("-o,--output", options->output, "output GGUF path");
  cmd->add_option("--threads", options->threads, "worker threads (default: all cores)");
  cmd->add_flag("--dry-run", options->dry_run, "print the metadata and tensor list instead of writing");
  cmd->add_flag("-v,--verbose", options->verbose, "print each tensor as it is written");
  cmd->callback([options, &exit_code] {
    try {
      mkmodel::run(*options);
      exit_code = 0;
    } catch (const std::exception& e) {
      std::fprintf(stderr, "sparrow mkmodel: %s\n", e.what());
      exit_code = 1;
    }
  });
}

}  // namespace sparrow::tools
